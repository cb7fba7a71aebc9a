package verbs

import (
	"fmt"

	"github.com/vfnic/vfnic/internal/bitflag"
)

// WCStatus is a work completion's status (enum ibv_wc_status). The values
// are libibverbs', so they compare with a C program's.
type WCStatus uint32

// Work completion statuses.
const (
	WCSuccess          WCStatus = 0
	WCLocLenErr        WCStatus = 1
	WCLocQPOpErr       WCStatus = 2
	WCLocEECOpErr      WCStatus = 3
	WCLocProtErr       WCStatus = 4
	WCWRFlushErr       WCStatus = 5
	WCMWBindErr        WCStatus = 6
	WCBadRespErr       WCStatus = 7
	WCLocAccessErr     WCStatus = 8
	WCRemInvReqErr     WCStatus = 9
	WCRemAccessErr     WCStatus = 10
	WCRemOpErr         WCStatus = 11
	WCRetryExcErr      WCStatus = 12
	WCRNRRetryExcErr   WCStatus = 13
	WCLocRDDViolErr    WCStatus = 14
	WCRemInvRDReqErr   WCStatus = 15
	WCRemAbortErr      WCStatus = 16
	WCInvEECNErr       WCStatus = 17
	WCInvEECStateErr   WCStatus = 18
	WCFatalErr         WCStatus = 19
	WCRespTimeoutErr   WCStatus = 20
	WCGeneralErr       WCStatus = 21
	WCTMErr            WCStatus = 22
	WCTMRndvIncomplete WCStatus = 23
	numStatuses                 = 24
)

// The texts of ibv_wc_status_str.
var statusText = [numStatuses]string{
	"success", "local length error", "local QP operation error",
	"local EE context operation error", "local protection error",
	"Work Request Flushed Error", "memory management operation error",
	"bad response error", "local access error", "remote invalid request error",
	"remote access error", "remote operation error",
	"transport retry counter exceeded", "RNR retry counter exceeded",
	"local RDD violation error", "remote invalid RD request", "aborted error",
	"invalid EE context number", "invalid EE context state", "fatal error",
	"response timeout error", "general error", "TM error",
	"TM software rendezvous",
}

// String returns ibv_wc_status_str's text.
func (s WCStatus) String() string {
	if s < numStatuses {
		return statusText[s]
	}
	return fmt.Sprintf("unknown status %d", uint32(s))
}

// WCOpcode is the operation a work completion reports (enum ibv_wc_opcode).
type WCOpcode uint32

// Work completion opcodes; receive opcodes have bit 7 set, as in verbs.
const (
	WCSend            WCOpcode = 0
	WCRDMAWrite       WCOpcode = 1
	WCRDMARead        WCOpcode = 2
	WCCompSwap        WCOpcode = 3
	WCFetchAdd        WCOpcode = 4
	WCBindMW          WCOpcode = 5
	WCLocalInv        WCOpcode = 6
	WCTSO             WCOpcode = 7
	WCRecv            WCOpcode = 128
	WCRecvRDMAWithImm WCOpcode = 129
)

// String names the opcode as verbs does (IBV_WC_ without the prefix).
func (o WCOpcode) String() string {
	switch o {
	case WCSend:
		return "SEND"
	case WCRDMAWrite:
		return "RDMA_WRITE"
	case WCRDMARead:
		return "RDMA_READ"
	case WCCompSwap:
		return "COMP_SWAP"
	case WCFetchAdd:
		return "FETCH_ADD"
	case WCBindMW:
		return "BIND_MW"
	case WCLocalInv:
		return "LOCAL_INV"
	case WCTSO:
		return "TSO"
	case WCRecv:
		return "RECV"
	case WCRecvRDMAWithImm:
		return "RECV_RDMA_WITH_IMM"
	}
	return fmt.Sprintf("WCOpcode(%d)", uint32(o))
}

// WCFlags are the per-completion flags (enum ibv_wc_flags).
type WCFlags uint32

// Per-completion flags.
const (
	WCFlagGRH      WCFlags = 1 << 0 // a GRH is present (never, on Ethernet devices)
	WCFlagWithImm  WCFlags = 1 << 1 // ImmData is valid
	WCFlagIPCsumOK WCFlags = 1 << 2 // the device verified the IP checksum
	WCFlagWithInv  WCFlags = 1 << 3 // an rkey was invalidated
)

// Fields selects the completion fields a CQ must report (enum
// ibv_wc_flags_ex, the wc_flags of ibv_cq_init_attr_ex). The values are
// libibverbs', except FieldCsumOK, a vfnic extension: verbs reports the
// checksum through IBV_WC_IP_CSUM_OK in every CQ's wc_flags.
type Fields uint64

// Completion fields.
const (
	FieldByteLen             Fields = 1 << 0
	FieldImm                 Fields = 1 << 1
	FieldQPNum               Fields = 1 << 2
	FieldSrcQP               Fields = 1 << 3
	FieldSLID                Fields = 1 << 4
	FieldSL                  Fields = 1 << 5
	FieldDLIDPathBits        Fields = 1 << 6
	FieldCompletionTimestamp Fields = 1 << 7
	FieldCVLAN               Fields = 1 << 8
	FieldFlowTag             Fields = 1 << 9
	FieldCompletionWallclock Fields = 1 << 11
	FieldCsumOK              Fields = 1 << 16
	allFields                       = FieldByteLen | FieldImm | FieldQPNum | FieldSrcQP | FieldSLID | FieldSL |
		FieldDLIDPathBits | FieldCompletionTimestamp | FieldCVLAN | FieldFlowTag | FieldCompletionWallclock | FieldCsumOK
)

var fieldNames = []bitflag.Name[Fields]{
	{Bits: FieldByteLen, Name: "BYTE_LEN"}, {Bits: FieldImm, Name: "IMM"},
	{Bits: FieldQPNum, Name: "QP_NUM"}, {Bits: FieldSrcQP, Name: "SRC_QP"},
	{Bits: FieldSLID, Name: "SLID"}, {Bits: FieldSL, Name: "SL"},
	{Bits: FieldDLIDPathBits, Name: "DLID_PATH_BITS"},
	{Bits: FieldCompletionTimestamp, Name: "COMPLETION_TIMESTAMP"},
	{Bits: FieldCVLAN, Name: "CVLAN"}, {Bits: FieldFlowTag, Name: "FLOW_TAG"},
	{Bits: FieldCompletionWallclock, Name: "COMPLETION_TIMESTAMP_WALLCLOCK"},
	{Bits: FieldCsumOK, Name: "CSUM_OK"},
}

// String lists the fields by their verbs names, e.g. "BYTE_LEN|QP_NUM".
func (f Fields) String() string { return bitflag.String(f, fieldNames) }

// CreateFlags are CQ creation flags (enum ibv_create_cq_attr_flags).
type CreateFlags uint32

// CQ creation flags.
const (
	// SingleThreaded: one goroutine at a time uses the CQ, so it takes no
	// lock (IBV_CREATE_CQ_ATTR_SINGLE_THREADED).
	SingleThreaded CreateFlags = 1 << 0
	// IgnoreOverrun: the CQ never enters the error state on overrun; the
	// application guarantees it never overflows
	// (IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN).
	IgnoreOverrun CreateFlags = 1 << 1
)

// DeviceAttr is what a device supports for CQs (the CQ part of
// ibv_query_device).
type DeviceAttr struct {
	// MaxCQE is the largest number of entries a CQ may ask for.
	MaxCQE int
	// NumCompVectors is the number of completion vectors; a CQ's
	// CompVector must be below it.
	NumCompVectors int
	// Fields are the completion fields the device reports.
	Fields Fields
	// Flags are the creation flags the device honours.
	Flags CreateFlags
	// Resize says whether ResizeCQ is supported.
	Resize bool
}
