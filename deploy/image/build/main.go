// Command build writes Bulkhead's images (package deploy/image): `make
// images` runs it after deploy/image/images.sh has built the binaries.
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/bulkhead-runtime/bulkhead/deploy/image"
)

func main() {
	var opts image.Options
	var epoch string
	flag.StringVar(&opts.Lock, "lock", "deploy/image/base.lock", "the lock file: the base's .debs and digest")
	flag.StringVar(&opts.DebDir, "debs", "", "directory of the pinned .debs")
	flag.BoolVar(&opts.Fetch, "fetch", true, "apt-get download a missing .deb")
	flag.BoolVar(&opts.CheckBuildHost, "check-build-host", true, "refuse build host packages other than the lock's")
	flag.StringVar(&opts.BinDir, "bin", "", "directory of the built binaries")
	flag.StringVar(&opts.InstallScript, "installer", "deploy/node/install.sh", "the node installer script")
	flag.StringVar(&opts.Out, "out", "bin/images", "where the OCI archives are written")
	flag.StringVar(&opts.Meta.Version, "version", "", "the release, also the tag")
	flag.StringVar(&opts.Meta.Revision, "revision", "", "the commit")
	flag.StringVar(&opts.Meta.Source, "source", image.Source, "the repository's URL")
	flag.StringVar(&opts.Meta.GoRelease, "go", "", "the Go release every binary must be built with")
	flag.StringVar(&epoch, "source-date-epoch", os.Getenv("SOURCE_DATE_EPOCH"), "the images' time, seconds since 1970 (the commit's)")
	flag.Parse()
	secs, err := strconv.ParseInt(epoch, 10, 64)
	if err != nil {
		fmt.Fprintf(os.Stderr, "images: -source-date-epoch %q: want seconds since 1970\n", epoch)
		os.Exit(2)
	}
	opts.Meta.Created = time.Unix(secs, 0).UTC()
	results, err := image.Run(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
	image.PrintResults(os.Stdout, results)
}
