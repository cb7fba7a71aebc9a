package verbs_test

import (
	"context"
	"fmt"

	"github.com/vfnic/vfnic/cq/qpsim"
	"github.com/vfnic/vfnic/verbs"
	"github.com/vfnic/vfnic/verbs/simverbs"
)

// The verbs event loop on the software device: arm, sleep on the
// completion channel, acknowledge, arm again, then drain the CQ with the
// iterator.
func Example() {
	d, err := qpsim.New(qpsim.Config{})
	if err != nil {
		panic(err)
	}
	defer d.Close()
	p := simverbs.New(d)
	fmt.Println("max CQE:", verbs.QueryDevice(p).MaxCQE)

	ch, err := verbs.NewCompChannel()
	if err != nil {
		panic(err)
	}
	defer ch.Close()
	c, err := verbs.CreateCQ(p, verbs.CQInitAttr{CQE: 100, Channel: ch, Context: "my CQ",
		Fields: verbs.FieldByteLen})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	fmt.Println("CQE:", c.CQE())
	qp, err := d.NewQP(qpsim.QPConfig{SendCQ: c.FI(), RecvCQ: c.FI()})
	if err != nil {
		panic(err)
	}
	defer qp.Close()

	if _, err := c.ReqNotify(false); err != nil {
		panic(err)
	}
	for id := uint64(1); id <= 3; id++ {
		// To its own address with no receive posted: the send completes.
		if err := qp.Send(qp.Addr(), id, make([]byte, 60), qpsim.SendOpts{}); err != nil {
			panic(err)
		}
	}
	got, ctx, err := ch.GetEvent(context.Background())
	if err != nil {
		panic(err)
	}
	got.AckEvents(1)
	fmt.Println("event from", ctx)
	if _, err := got.ReqNotify(false); err != nil {
		panic(err)
	}
	_ = qp.Flush(context.Background())
	n := 0
	for n < 3 {
		if err := got.StartPoll(); err != nil {
			continue // ENOENT: not all written yet
		}
		for {
			fmt.Println(got.WRID(), got.Status(), got.Opcode(), got.ByteLen())
			n++
			if got.NextPoll() != nil {
				break
			}
		}
		got.EndPoll()
	}
	// Output:
	// max CQE: 65536
	// CQE: 128
	// event from my CQ
	// 1 success SEND 60
	// 2 success SEND 60
	// 3 success SEND 60
}
