package identity

import "testing"

func TestResolve(t *testing.T) {
	for _, tc := range []struct {
		name               string
		hooks              []string
		watch, def         string
		wantUser, wantFrom string
	}{
		{"the manager", nil, "", "", "", FromManager},
		{"the default", nil, "", "chartpilot-deployer", "system:serviceaccount:shop:chartpilot-deployer", FromDefault},
		{"the watch over the default", nil, "deploy", "chartpilot-deployer", "system:serviceaccount:shop:deploy", FromWatch},
		{"a hook over both", []string{"system:serviceaccount:shop:tenant"}, "deploy", "chartpilot-deployer", "system:serviceaccount:shop:tenant", FromHook},
		{"hooks naming none", []string{"", ""}, "deploy", "", "system:serviceaccount:shop:deploy", FromWatch},
		{"the last hook that names one", []string{"system:serviceaccount:shop:first", "system:serviceaccount:shop:last", ""}, "", "", "system:serviceaccount:shop:last", FromHook},
	} {
		user, from := Resolve("shop", tc.hooks, tc.watch, tc.def)
		if user != tc.wantUser || from != tc.wantFrom {
			t.Errorf("%s: Resolve = %q from %q, want %q from %q", tc.name, user, from, tc.wantUser, tc.wantFrom)
		}
	}
}

func TestParseServiceAccount(t *testing.T) {
	for user, want := range map[string][2]string{
		"system:serviceaccount:shop:deploy": {"shop", "deploy"},
		"system:serviceaccount:shop:":       {},
		"system:serviceaccount::deploy":     {},
		"system:serviceaccount:shop:a:b":    {},
		"alice":                             {},
		"system:serviceaccounts:shop":       {},
	} {
		ns, name, ok := ParseServiceAccount(user)
		if ok != (want != [2]string{}) || [2]string{ns, name} != want && ok {
			t.Errorf("ParseServiceAccount(%q) = %q %q %v, want %q", user, ns, name, ok, want)
		}
		if ok && ServiceAccount(ns, name) != user {
			t.Errorf("ServiceAccount(%q, %q) does not give %q back", ns, name, user)
		}
	}
}
