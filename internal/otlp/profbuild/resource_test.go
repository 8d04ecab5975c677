package profbuild

import (
	"testing"

	"go.opentelemetry.io/collector/pdata/pcommon"

	pframe "github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/host/normalize"
)

// What the host knows of a process's container, pod and namespace goes on
// its resource, and nothing of it when the process is on the host.
func TestResourceContainerAttributes(t *testing.T) {
	const id = "7e3f6b1c2d9a4e8f0b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f70"
	r := &run{b: New(Options{})}
	for _, tc := range []struct {
		name string
		p    *normalize.Process
		want map[string]any
	}{
		{
			"in a pod", &normalize.Process{PID: 4242, ExePath: "/app/busy", ContainerID: id, PodUID: "3f2a1b4c-5d6e-4f70-8a9b-0c1d2e3f4a5b", ContainerRuntime: "containerd", VPID: 1},
			map[string]any{pframe.AttrContainerID: id, pframe.AttrK8sPodUID: "3f2a1b4c-5d6e-4f70-8a9b-0c1d2e3f4a5b", pframe.AttrContainerRuntime: "containerd", pframe.AttrVPID: int64(1)},
		},
		{"on the host", &normalize.Process{PID: 4242, ExePath: "/usr/bin/busy"}, map[string]any{}},
		{"never read", nil, map[string]any{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := pcommon.NewResource()
			r.fillResource(res, &procOut{pid: 4242, p: tc.p, comm: "busy"})
			got := res.Attributes().AsRaw()
			for _, k := range []string{pframe.AttrContainerID, pframe.AttrK8sPodUID, pframe.AttrContainerRuntime, pframe.AttrVPID} {
				if got[k] != tc.want[k] {
					t.Errorf("%s = %v, want %v", k, got[k], tc.want[k])
				}
			}
			if got[pframe.AttrPID] != int64(4242) {
				t.Errorf("process.pid %v", got[pframe.AttrPID])
			}
		})
	}
}
