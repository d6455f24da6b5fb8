// Package identity is the one rule of who chartpilot's writes for a
// resource run as, shared by the release reconciler, the backup
// controllers and the operator's wiring.
package identity

import "strings"

// Where a user came from, for messages that name the setting to fix.
const (
	FromHook           = "the resource's Tenant"
	FromWatch          = "the watch's serviceAccountName"
	FromDefault        = "--default-service-account"
	FromManager        = ""
	serviceAccountUser = "system:serviceaccount:"
)

// Resolve is the user a resource's writes run as, and where it came
// from: the last of the hooks' users (in the watch's hook order) that is
// not empty (a Tenant's ServiceAccount), else the watch's
// serviceAccountName, else the operator's default ServiceAccount
// (--default-service-account), each in the resource's namespace. ""
// (FromManager) is the manager itself.
func Resolve(namespace string, fromHooks []string, watchServiceAccount, defaultServiceAccount string) (user, source string) {
	for i := len(fromHooks) - 1; i >= 0; i-- {
		if fromHooks[i] != "" {
			return fromHooks[i], FromHook
		}
	}
	if watchServiceAccount != "" {
		return ServiceAccount(namespace, watchServiceAccount), FromWatch
	}
	if defaultServiceAccount != "" {
		return ServiceAccount(namespace, defaultServiceAccount), FromDefault
	}
	return "", FromManager
}

// ServiceAccount is the user ServiceAccount namespace/name is
// impersonated as.
func ServiceAccount(namespace, name string) string {
	return serviceAccountUser + namespace + ":" + name
}

// ParseServiceAccount splits system:serviceaccount:NAMESPACE:NAME; false
// for any other user.
func ParseServiceAccount(user string) (namespace, name string, ok bool) {
	rest, found := strings.CutPrefix(user, serviceAccountUser)
	if !found {
		return "", "", false
	}
	namespace, name, ok = strings.Cut(rest, ":")
	return namespace, name, ok && namespace != "" && name != "" && !strings.Contains(name, ":")
}
