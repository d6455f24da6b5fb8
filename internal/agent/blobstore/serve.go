package blobstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"gocloud.dev/blob"

	"github.com/chartpilot/chartpilot/internal/backup"
)

// maxRequest bounds the request read from the manager.
const maxRequest = 1 << 20

// Serve answers one request of the manager (the store helper,
// `chartpilot store`): a backup.StoreRequest read from in, a
// backup.StoreReply written to out. An error is returned only when no
// reply could be written.
func Serve(ctx context.Context, in io.Reader, out io.Writer) error {
	var req backup.StoreRequest
	data, err := io.ReadAll(io.LimitReader(in, maxRequest+1))
	if err != nil {
		return err
	}
	if len(data) > maxRequest {
		return errors.New("the request is larger than 1 MiB")
	}
	if err := json.Unmarshal(data, &req); err != nil {
		return errors.New("the request is not JSON")
	}
	if req.TimeoutMillis > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(req.TimeoutMillis)*time.Millisecond)
		defer cancel()
	}
	reply := answer(ctx, req)
	reply.Done = true
	return json.NewEncoder(out).Encode(reply)
}

func answer(ctx context.Context, req backup.StoreRequest) backup.StoreReply {
	secrets := req.Secrets()
	b, err := open(ctx, req)
	if err != nil {
		return backup.StoreReply{Invalid: backup.Scrub(err, secrets...)}
	}
	defer b.Close()
	switch req.Op {
	case "probe":
		if err := Probe(ctx, b); err != nil {
			return backup.StoreReply{Failed: backup.Scrub(err, secrets...)}
		}
		return backup.StoreReply{}
	case "manifest":
		m, err := backup.ReadManifest(ctx, b, req.Location)
		if err != nil {
			return backup.StoreReply{Failed: backup.Scrub(err, secrets...)}
		}
		return backup.StoreReply{Manifest: m}
	}
	return backup.StoreReply{Invalid: fmt.Sprintf("op %q: must be probe or manifest", req.Op)}
}

// open opens the one store req names.
func open(ctx context.Context, req backup.StoreRequest) (*blob.Bucket, error) {
	n := 0
	for _, set := range []bool{req.S3 != nil, req.Azure != nil, req.GCS != nil} {
		if set {
			n++
		}
	}
	switch {
	case n != 1:
		return nil, errors.New("the request must name exactly one of s3, azure or gcs")
	case req.S3 != nil:
		return OpenS3(ctx, *req.S3)
	case req.Azure != nil:
		return OpenAzure(ctx, *req.Azure)
	}
	return OpenGCS(ctx, *req.GCS)
}

// Probe writes a random object, reads it back and deletes it.
func Probe(ctx context.Context, b *blob.Bucket) error {
	token := make([]byte, 16)
	_, _ = rand.Read(token)
	key := ".chartpilot-probe/" + hex.EncodeToString(token)
	// Upload, not WriteAll: one call per object, which every driver aborts
	// cleanly on an error.
	if err := b.Upload(ctx, key, bytes.NewReader(token), &blob.WriterOptions{ContentType: "application/octet-stream"}); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	got, err := b.ReadAll(ctx, key)
	if err != nil {
		return fmt.Errorf("read: %w", err)
	}
	if !bytes.Equal(got, token) {
		return errors.New("read: the object read back differs from the one written")
	}
	if err := b.Delete(ctx, key); err != nil {
		return fmt.Errorf("delete: %w", err)
	}
	return nil
}
