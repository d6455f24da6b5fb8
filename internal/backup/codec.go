package backup

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"filippo.io/age"
	"github.com/klauspost/compress/zstd"
)

// Encode copies src to dst compressed (CompressionZstd or CompressionNone)
// and, with a recipient (an age X25519 public key, "age1…"), encrypted for
// it; it closes the encoders so that dst holds everything, and returns the
// number of bytes read from src. Backups and archived WAL share it.
func Encode(dst io.Writer, src io.Reader, compression, recipient string) (int64, error) {
	var r age.Recipient
	if recipient != "" {
		x, err := age.ParseX25519Recipient(strings.TrimSpace(recipient))
		if err != nil {
			return 0, fmt.Errorf("encryption recipient: not an age X25519 public key (age1…): %w", err)
		}
		r = x
	}
	plain := &counter{}
	err := encode(dst, src, plain, compression, r)
	return plain.n, err
}

// encode copies src (counted in plain) to dst, compressed and, with a
// recipient, encrypted, and closes the encoders so that dst holds it all.
func encode(dst io.Writer, src io.Reader, plain *counter, compression string, recipient age.Recipient) error {
	if compression != CompressionZstd && compression != CompressionNone {
		return fmt.Errorf("compression %q: must be %s or %s", compression, CompressionZstd, CompressionNone)
	}
	var closers []io.Closer
	out := dst
	if recipient != nil {
		ew, err := age.Encrypt(out, recipient)
		if err != nil {
			return err
		}
		closers = append(closers, ew)
		out = ew
	}
	if compression == CompressionZstd {
		zw, err := zstd.NewWriter(out, zstd.WithEncoderLevel(zstd.SpeedDefault))
		if err != nil {
			return err
		}
		closers = append(closers, zw)
		out = zw
	}
	if _, err := io.Copy(io.MultiWriter(out, plain), src); err != nil {
		return err
	}
	for i := len(closers) - 1; i >= 0; i-- {
		if err := closers[i].Close(); err != nil {
			return err
		}
	}
	return nil
}

// Decode is the plain stream of stored bytes src that were encoded as m
// says (its Compression, Encryption and Recipient): decrypted with
// identity (an age X25519 secret key, "AGE-SECRET-KEY-1…") when m says
// age, and decompressed. Call the returned function when done (it may be
// nil). The caller checks the stored bytes' size and checksum first.
func Decode(src io.Reader, m *Manifest, identity string) (io.Reader, func(), error) {
	in := src
	switch m.Encryption {
	case "":
	case "age":
		if identity == "" {
			return nil, nil, fmt.Errorf("the data is encrypted (for %s) and no key was given", m.Recipient)
		}
		id, err := age.ParseX25519Identity(strings.TrimSpace(identity))
		if err != nil {
			return nil, nil, errors.New("encryption key: not an age X25519 secret key (AGE-SECRET-KEY-1…)")
		}
		if id.Recipient().String() != m.Recipient {
			return nil, nil, fmt.Errorf("the data was encrypted for %s and the key given is for %s: use the key it was made with", m.Recipient, id.Recipient())
		}
		dr, err := age.Decrypt(in, id)
		if err != nil {
			return nil, nil, fmt.Errorf("decrypting: %w", err)
		}
		in = dr
	default:
		return nil, nil, fmt.Errorf("encryption %q: not age or empty", m.Encryption)
	}
	switch m.Compression {
	case CompressionNone:
		return in, nil, nil
	case CompressionZstd:
		zr, err := zstd.NewReader(in)
		if err != nil {
			return nil, nil, err
		}
		return zr, zr.Close, nil
	}
	return nil, nil, fmt.Errorf("compression %q: must be %s or %s", m.Compression, CompressionZstd, CompressionNone)
}
