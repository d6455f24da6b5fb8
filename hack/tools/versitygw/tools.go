//go:build tools

// Package tools pins versitygw, the S3 server the backup tests store to.
package tools

import _ "github.com/versity/versitygw/cmd/versitygw"
