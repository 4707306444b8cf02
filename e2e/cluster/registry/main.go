// Command registry is an OCI distribution registry on loopback for `make bench-coldstart`: the
// real node's containerd pulls from it over plain HTTP (containerd's CRI treats localhost and
// 127.0.0.1 as plain-HTTP registries), so a start can pay a real image pull on a machine that
// reaches no registry. go-containerregistry's registry package serves the protocol; blobs live
// on disk.
//
//	registry serve --address 127.0.0.1:5000 --dir DIR
//	registry push --archive IMAGE.tar --ref 127.0.0.1:5000/llmop/engine-sim:bench [--salt S]
//
// push reads an OCI archive (e2e/images/images.py archive) and uploads its image. With --salt,
// every layer gets one more file (/.llmop-salt-<S>), so its digests (compressed and not) are new:
// a node that has the original image still has to download and unpack every layer, as a node
// that never saw the image does.
package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/registry"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: registry serve|push|version [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:])
	case "push":
		err = push(os.Args[2:])
	case "version":
		fmt.Println("registry (llmop bench) go-containerregistry v0.22.1")
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "registry:", err)
		os.Exit(1)
	}
}

func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	address := fs.String("address", "127.0.0.1:5000", "where to listen (loopback only)")
	dir := fs.String("dir", "", "directory for the blobs")
	_ = fs.Parse(args)
	if *dir == "" {
		return errors.New("--dir is required")
	}
	if !strings.HasPrefix(*address, "127.0.0.1:") && !strings.HasPrefix(*address, "localhost:") {
		return fmt.Errorf("--address %s: loopback only", *address)
	}
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		return err
	}
	handler := registry.New(
		registry.Logger(log.New(io.Discard, "", 0)),
		registry.WithBlobHandler(registry.NewDiskBlobHandler(*dir)),
	)
	server := &http.Server{Addr: *address, Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(os.Stderr, "registry: serving %s from %s\n", *address, *dir)
	return server.ListenAndServe()
}

func push(args []string) error {
	fs := flag.NewFlagSet("push", flag.ExitOnError)
	archive := fs.String("archive", "", "OCI archive (a tar of an OCI layout) holding one image")
	ref := fs.String("ref", "", "where to push, e.g. 127.0.0.1:5000/llmop/engine-sim:bench")
	salt := fs.String("salt", "", "add /.llmop-salt-<salt> to every layer (new digests)")
	_ = fs.Parse(args)
	if *archive == "" || *ref == "" {
		return errors.New("--archive and --ref are required")
	}
	dir, err := os.MkdirTemp("", "registry-push-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := untar(*archive, dir); err != nil {
		return fmt.Errorf("reading %s: %w", *archive, err)
	}
	img, err := firstImage(dir)
	if err != nil {
		return err
	}
	if *salt != "" {
		if img, err = salted(img, *salt); err != nil {
			return err
		}
	}
	target, err := name.ParseReference(*ref, name.Insecure)
	if err != nil {
		return err
	}
	started := time.Now()
	if err := remote.Write(target, img); err != nil {
		return fmt.Errorf("pushing %s: %w", *ref, err)
	}
	size := int64(0)
	if layers, err := img.Layers(); err == nil {
		for _, layer := range layers {
			if n, err := layer.Size(); err == nil {
				size += n
			}
		}
	}
	fmt.Fprintf(os.Stderr, "registry: pushed %s (%d MiB compressed) in %.1fs\n",
		*ref, size>>20, time.Since(started).Seconds())
	return nil
}

func untar(archive, dir string) error {
	f, err := os.Open(archive)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		path := filepath.Join(dir, filepath.Clean("/"+hdr.Name))
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(path, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				return err
			}
			out, err := os.Create(path)
			if err != nil {
				return err
			}
			if _, err := io.Copy(out, tr); err != nil {
				out.Close()
				return err
			}
			if err := out.Close(); err != nil {
				return err
			}
		}
	}
}

func firstImage(dir string) (v1.Image, error) {
	index, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, err
	}
	manifest, err := index.IndexManifest()
	if err != nil {
		return nil, err
	}
	if len(manifest.Manifests) == 0 {
		return nil, errors.New("the archive's index names no image")
	}
	return index.Image(manifest.Manifests[0].Digest)
}

// salted adds one small file to every layer, so no digest of the image is one a node has.
func salted(img v1.Image, salt string) (v1.Image, error) {
	layers, err := img.Layers()
	if err != nil {
		return nil, err
	}
	config, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	config = config.DeepCopy()
	config.RootFS.DiffIDs = nil
	config.History = nil
	out, err := mutate.ConfigFile(empty.Image, config)
	if err != nil {
		return nil, err
	}
	if mt, err := img.MediaType(); err == nil {
		out = mutate.MediaType(out, mt)
	}
	for index, layer := range layers {
		fresh, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
			return withFile(layer, fmt.Sprintf(".llmop-salt-%s-%d", salt, index))
		})
		if err != nil {
			return nil, err
		}
		if out, err = mutate.AppendLayers(out, fresh); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// withFile streams the layer's uncompressed tar with one more regular file at the end.
func withFile(layer v1.Layer, file string) (io.ReadCloser, error) {
	src, err := layer.Uncompressed()
	if err != nil {
		return nil, err
	}
	reader, writer := io.Pipe()
	go func() {
		defer src.Close()
		tr := tar.NewReader(src)
		tw := tar.NewWriter(writer)
		for {
			hdr, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				writer.CloseWithError(err)
				return
			}
			if err := tw.WriteHeader(hdr); err != nil {
				writer.CloseWithError(err)
				return
			}
			if _, err := io.Copy(tw, tr); err != nil {
				writer.CloseWithError(err)
				return
			}
		}
		body := []byte(file + "\n")
		hdr := &tar.Header{Name: file, Mode: 0o644, Size: int64(len(body)), ModTime: time.Unix(0, 0)}
		if err := tw.WriteHeader(hdr); err != nil {
			writer.CloseWithError(err)
			return
		}
		if _, err := io.Copy(tw, bytes.NewReader(body)); err != nil {
			writer.CloseWithError(err)
			return
		}
		writer.CloseWithError(tw.Close())
	}()
	return reader, nil
}
