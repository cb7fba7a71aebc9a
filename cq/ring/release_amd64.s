//go:build !race

#include "textflag.h"

// func storeRelease32(p *uint32, v uint32)
TEXT ·storeRelease32(SB), NOSPLIT, $0-12
	MOVQ p+0(FP), AX
	MOVL v+8(FP), BX
	MOVL BX, (AX)
	RET
