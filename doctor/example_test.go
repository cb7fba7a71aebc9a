package doctor_test

import (
	"fmt"

	"github.com/vfnic/vfnic/doctor"
)

// Before binding a NIC, explain in one message why VFIO cannot work here.
func ExampleRun() {
	r := doctor.Run(doctor.Env{})
	if err := r.Err(); err != nil {
		fmt.Println("not ready:", err)
		return
	}
	fmt.Println("ready")
}
