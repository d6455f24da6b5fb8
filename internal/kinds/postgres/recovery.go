package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
)

// RecoverContainer is the chart's init container of pod 0 that makes the
// first data from a WAL archive (bootstrap.recovery).
const RecoverContainer = "recover"

// recoveryStatus is status.recovery of a Postgres with
// spec.bootstrap.recovery, read from pod 0's recover container: its state,
// and the outcome it writes as its termination message. A completed
// recovery is kept as it was (later pods skip it). nil without
// spec.bootstrap.recovery.
func recoveryStatus(ctx context.Context, c client.Reader, obj *unstructured.Unstructured, pg *v1alpha1.Postgres) (*v1alpha1.PostgresRecoveryStatus, error) {
	if pg.Spec.Bootstrap == nil || pg.Spec.Bootstrap.Recovery == nil {
		return nil, nil
	}
	if prev := pg.Status.Recovery; prev != nil && prev.Phase == v1alpha1.RecoveryCompleted {
		return prev, nil
	}
	rec := pg.Spec.Bootstrap.Recovery
	st := &v1alpha1.PostgresRecoveryStatus{Phase: v1alpha1.RecoveryPending, Target: recoveryTarget(rec)}
	pod := &corev1.Pod{}
	name := obj.GetName() + "-0"
	err := c.Get(ctx, types.NamespacedName{Namespace: obj.GetNamespace(), Name: name}, pod)
	switch {
	case apierrors.IsNotFound(err):
		st.Message = "waiting for pod " + name + ", which recovers before its server starts"
		return st, nil
	case err != nil:
		return nil, fmt.Errorf("reading pod %s: %w", name, err)
	}
	var cs *corev1.ContainerStatus
	for i := range pod.Status.InitContainerStatuses {
		if pod.Status.InitContainerStatuses[i].Name == RecoverContainer {
			cs = &pod.Status.InitContainerStatuses[i]
		}
	}
	if cs == nil {
		st.Message = "pod " + name + " has not started its " + RecoverContainer + " container yet"
		return st, nil
	}
	term := cs.State.Terminated
	if term == nil && cs.State.Running == nil {
		term = cs.LastTerminationState.Terminated // waiting to be restarted
	}
	switch {
	case cs.State.Running != nil:
		st.Phase, st.Message = v1alpha1.RecoveryRunning, "pod "+name+" recovers from the archive"
	case term != nil:
		readOutcome(st, term)
	default:
		st.Message = "pod " + name + "'s " + RecoverContainer + " container waits to start"
	}
	return st, nil
}

// readOutcome fills st from the recover container's end: the agent's
// outcome (JSON) as its termination message, else the message's last line.
func readOutcome(st *v1alpha1.PostgresRecoveryStatus, term *corev1.ContainerStateTerminated) {
	var out struct {
		Message             string `json:"message"`
		Target              string `json:"target"`
		Base                string `json:"base"`
		Timeline            int64  `json:"timeline"`
		LastTransactionTime string `json:"lastTransactionTime"`
	}
	if err := json.Unmarshal([]byte(term.Message), &out); err != nil {
		out.Message = lastLine(term.Message)
	}
	st.Message = clip(out.Message, 1024)
	if out.Target != "" {
		st.Target = out.Target
	}
	st.BaseBackup, st.Timeline, st.LastTransactionTime = out.Base, out.Timeline, out.LastTransactionTime
	if term.ExitCode == 0 { // recovered, or skipped: the data was there
		st.Phase = v1alpha1.RecoveryCompleted
		return
	}
	st.Phase = v1alpha1.RecoveryFailed
	if st.Message == "" {
		st.Message = fmt.Sprintf("the %s container ended with exit code %d", RecoverContainer, term.ExitCode)
	}
	st.Message += " (the kubelet tries again; the server does not start until the recovery succeeds)"
}

// recoveryTarget says what a recovery stops at, as the agent does.
func recoveryTarget(r *v1alpha1.PostgresRecovery) string {
	switch {
	case r.TargetTime != "":
		return "time " + r.TargetTime
	case r.TargetLSN != "":
		return "LSN " + r.TargetLSN
	case r.TargetXID != "":
		return "transaction " + r.TargetXID
	}
	return "the end of the archive"
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
