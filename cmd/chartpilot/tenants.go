package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
)

// tenantsCommand is `chartpilot tenants`: each Tenant's namespaces, the
// resources and storage its namespaces use against its limits, and the
// resources that break a limit.
func tenantsCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("chartpilot tenants", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var conn connFlags
	conn.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg, _, err := conn.connect("")
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	list, err := dyn.Resource(v1alpha1.GroupVersion.WithResource("tenants")).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing Tenants: %w", err)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tREADY\tNAMESPACES\tRESOURCES\tSTORAGE USED / MAX\tVIOLATIONS")
	var violations []string
	for i := range list.Items {
		t, err := tenantOf(&list.Items[i])
		if err != nil {
			return err
		}
		ready := "Unknown"
		for _, c := range t.Status.Conditions {
			if c.Type == v1alpha1.ConditionReady {
				ready = string(c.Status)
				if c.Status != metav1.ConditionTrue {
					ready += " (" + c.Reason + ")"
				}
			}
		}
		storage := orDash(t.Status.StorageUsed)
		if m := t.Spec.Limits.MaxTotalStorage; m != nil {
			storage += " / " + m.String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%d\n", t.Name, ready, orDash(strings.Join(t.Status.Namespaces, ",")), t.Status.Resources, storage, len(t.Status.Violations))
		for _, v := range t.Status.Violations {
			violations = append(violations, t.Name+": "+v)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(violations) > 0 {
		fmt.Fprintln(stdout, "\nViolations:")
		for _, v := range violations {
			fmt.Fprintln(stdout, "  "+v)
		}
	}
	return nil
}

func tenantOf(u *unstructured.Unstructured) (*v1alpha1.Tenant, error) {
	t := &v1alpha1.Tenant{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, t); err != nil {
		return nil, fmt.Errorf("reading Tenant %s: %w", u.GetName(), err)
	}
	return t, nil
}
