package disk_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/servicetest"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/disk"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/imageimport"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

func TestDiskErrorsBecomeReasons(t *testing.T) {
	for _, tc := range []struct {
		name   string
		setup  func(*servicetest.Fixture)
		reason string
	}{
		{"missing volume", func(f *servicetest.Fixture) { f.LM.Spec.Image.Volume.Name = "nope" }, infrav1.ImageNotFoundReason},
		{"missing url", func(f *servicetest.Fixture) {
			f.LM.Spec.Image = infrav1.ImageSource{URL: "file:///nope.qcow2", Checksum: "sha256:" + strings.Repeat("a", 64)}
		}, infrav1.ImageNotFoundReason},
		{"checksum", func(f *servicetest.Fixture) {
			f.Host.Images["file:///img.qcow2"] = strings.Repeat("b", 64)
			f.LM.Spec.Image = infrav1.ImageSource{URL: "file:///img.qcow2", Checksum: "sha256:" + strings.Repeat("a", 64)}
		}, infrav1.ImageChecksumMismatchReason},
		{"pool full", func(f *servicetest.Fixture) {
			f.Host.Errs["EnsureOverlay"] = fmt.Errorf("%w: no space left on device", virt.ErrPoolFull)
		}, infrav1.PoolFullReason},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := servicetest.NewFixture(t)
			tc.setup(f)
			fs := f.Scope()
			err := servicetest.Reconcile(fs, infrav1.DiskReadyCondition, disk.New(fs.VM, fs.Host, &servicetest.SyncImporter{Host: f.Host}))
			if _, ok := services.AsRequeue(err); !ok {
				t.Fatalf("err = %v, want a requeue", err)
			}
			servicetest.WantCondition(t, f.LM, infrav1.DiskReadyCondition, metav1.ConditionFalse, tc.reason)
		})
	}
}

// runningImporter reports an import under way.
type runningImporter struct{ st imageimport.Status }

func (i runningImporter) Ensure(imageimport.Key, imageimport.Waiter) imageimport.Status { return i.st }

func (runningImporter) Release(imageimport.Waiter) {}

func (runningImporter) Want(virt.StorageHost, string, string) {}

func TestDiskImportReasons(t *testing.T) {
	for _, tc := range []struct {
		name    string
		st      imageimport.Status
		reason  string
		message string
	}{
		{"running", imageimport.Status{Phase: imageimport.Running, Attempt: 1, Read: 3 << 20, Total: 12 << 20, Elapsed: 3 * time.Second},
			infrav1.WaitingForImageImportReason, "3.0 MiB of 12.0 MiB (25%), 1.0 MiB/s"},
		{"no answer yet", imageimport.Status{Phase: imageimport.Running, Attempt: 2, Elapsed: 4 * time.Second},
			infrav1.WaitingForImageImportReason, "(attempt 2): waiting for the source to answer (4s so far)"},
		{"timed out", imageimport.Status{Phase: imageimport.Failed, Attempt: 1, Err: errors.New("timeout awaiting response headers"), RetryAt: time.Now().Add(time.Minute)},
			infrav1.ImageImportFailedReason, "timeout awaiting response headers"},
		{"not found", imageimport.Status{Phase: imageimport.Failed, Attempt: 1, Err: fmt.Errorf("%w: 404", virt.ErrImageNotFound), RetryAt: time.Now().Add(time.Minute)},
			infrav1.ImageNotFoundReason, "404"},
		{"backing file", imageimport.Status{Phase: imageimport.Failed, Attempt: 1, Err: &virt.ImageRefusedError{Err: virt.ErrImageHasBackingFile, Detail: "its qcow2 header names a backing file"}, RetryAt: time.Now().Add(time.Minute)},
			infrav1.ImageHasBackingFileReason, "names a backing file"},
		{"data file", imageimport.Status{Phase: imageimport.Failed, Attempt: 1, Err: &virt.ImageRefusedError{Err: virt.ErrImageHasDataFile, Detail: "external data file"}, RetryAt: time.Now().Add(time.Minute)},
			infrav1.ImageHasDataFileReason, "external data file"},
		{"vmdk", imageimport.Status{Phase: imageimport.Failed, Attempt: 1, Err: &virt.ImageRefusedError{Err: virt.ErrImageFormatUnsupported, Detail: "it is a vmdk image"}, RetryAt: time.Now().Add(time.Minute)},
			infrav1.ImageFormatUnsupportedReason, "vmdk"},
		{"too large", imageimport.Status{Phase: imageimport.Failed, Attempt: 1, Err: fmt.Errorf("%w: 40 GiB", virt.ErrImageTooLarge), RetryAt: time.Now().Add(time.Minute)},
			infrav1.ImageTooLargeReason, "40 GiB"},
		{"larger than the disk, refused", imageimport.Status{Phase: imageimport.Refused, Attempt: 1, Err: fmt.Errorf("%w: the source sent more than 2147483648 bytes", virt.ErrImageLargerThanDisk)},
			infrav1.ImageLargerThanDiskReason, "not fetched again until spec.image or the disk size changes"},
		{"denied address", imageimport.Status{Phase: imageimport.Failed, Attempt: 1, Err: fmt.Errorf("%w: 169.254.169.254", virt.ErrImageSourceRefused), RetryAt: time.Now().Add(time.Minute)},
			infrav1.ImageSourceNotAllowedReason, "169.254.169.254"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := servicetest.NewFixture(t)
			f.LM.Spec.Image = infrav1.ImageSource{URL: "http://user:pw@images.example/img.qcow2?sig=s3cr3t", Checksum: "sha256:" + strings.Repeat("a", 64)}
			fs := f.Scope()
			err := servicetest.Reconcile(fs, infrav1.DiskReadyCondition, disk.New(fs.VM, fs.Host, runningImporter{tc.st}))
			if rq, ok := services.AsRequeue(err); !ok || rq.After <= 0 {
				t.Fatalf("err = %v, want a timed requeue", err)
			}
			c := servicetest.WantCondition(t, f.LM, infrav1.DiskReadyCondition, metav1.ConditionFalse, tc.reason)
			if c != nil && !strings.Contains(c.Message, tc.message) {
				t.Errorf("message %q does not say %q", c.Message, tc.message)
			}
			if c != nil && (strings.Contains(c.Message, "s3cr3t") || strings.Contains(c.Message, "pw@")) {
				t.Errorf("message %q shows the URL's credentials", c.Message)
			}
			if f.Host.Called("EnsureOverlay") {
				t.Error("overlay created before the image")
			}
		})
	}
}

func TestDiskImportsByChecksum(t *testing.T) {
	f := servicetest.NewFixture(t)
	sum := strings.Repeat("c", 64)
	f.Host.Images["file:///img.qcow2"] = sum
	f.LM.Spec.Image = infrav1.ImageSource{URL: "file:///img.qcow2", Checksum: "sha256:" + sum}
	s := f.Scope()
	if err := servicetest.Reconcile(s, infrav1.DiskReadyCondition, disk.New(s.VM, s.Host, &servicetest.SyncImporter{Host: f.Host})); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.Host.Volumes["pool/"+naming.ImageVolumeName(sum)]; !ok {
		t.Errorf("base not imported under its checksum name: %v", f.Host.Volumes)
	}
	ov, ok := f.Host.Volumes["pool/"+s.VM.OverlayVolume()]
	if !ok || ov.CapacityBytes != uint64(infrav1.DefaultDiskSizeGiB)<<30 {
		t.Errorf("overlay = %+v", ov)
	}
	if f.Host.Pools["pool"].Path != "/pools/pool" {
		t.Errorf("pool not ensured: %v", f.Host.Pools)
	}
	images := &servicetest.SyncImporter{Host: f.Host}
	if err := disk.New(s.VM, s.Host, images).Delete(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(images.Released) != 1 || images.Released[0].Name != f.LM.Name {
		t.Errorf("Delete released %v, want the machine's wait", images.Released)
	}
	if _, ok := f.Host.Volumes["pool/"+s.VM.OverlayVolume()]; ok {
		t.Error("overlay survived Delete")
	}
	if _, ok := f.Host.Volumes["pool/"+naming.ImageVolumeName(sum)]; !ok {
		t.Error("Delete removed the shared base image")
	}
}

// TestDiskBaseImageGone: a root disk found existing whose base image is
// gone is not reused: DiskReady is False with BaseImageMissing, naming the
// missing file, and the reconcile comes back. Before, the overlay was
// taken as ready because it existed and was large enough.
func TestDiskBaseImageGone(t *testing.T) {
	f := servicetest.NewFixture(t)
	fs := f.Scope()
	f.Host.Volumes["pool/"+fs.VM.OverlayVolume()] = virt.VolumeInfo{Pool: "pool", Name: fs.VM.OverlayVolume(), CapacityBytes: 100 << 30,
		Format: "qcow2", BackingPath: "/pools/pool/gone", BackingMissing: true}
	root := disk.New(fs.VM, fs.Host, &servicetest.SyncImporter{Host: f.Host})
	err := servicetest.Reconcile(fs, infrav1.DiskReadyCondition, root)
	if _, ok := services.AsRequeue(err); !ok {
		t.Fatalf("err = %v, want a requeue", err)
	}
	c := servicetest.WantCondition(t, f.LM, infrav1.DiskReadyCondition, metav1.ConditionFalse, infrav1.BaseImageMissingReason)
	if c != nil && !strings.Contains(c.Message, "/pools/pool/gone") {
		t.Errorf("DiskReady says %q, want the missing file named", c.Message)
	}
	if root.Volume() != nil {
		t.Errorf("the root disk was taken: %+v", root.Volume())
	}
}

// wantingImporter records the images reconciles name themselves.
type wantingImporter struct {
	servicetest.SyncImporter
	wanted []string
}

func (i *wantingImporter) Want(host virt.StorageHost, pool, volume string) {
	i.wanted = append(i.wanted, fmt.Sprintf("%t %s/%s", host != nil, pool, volume))
}

// TestDiskWantsNamedImage: a machine naming an imported image by
// spec.image.volume tells the importer it uses it, so the image collector
// spares it as it spares the images it imports for machines; a volume
// that is no imported image is not reported. Before, such an image was
// never marked as wanted and could be collected before its overlay was
// made.
func TestDiskWantsNamedImage(t *testing.T) {
	image := naming.ImageVolumeName(strings.Repeat("ab", 32))
	for _, tc := range []struct {
		name, volume string
		want         []string
	}{
		{"imported image", image, []string{"true pool/" + image}},
		{"operator's volume", "base", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := servicetest.NewFixture(t)
			f.Host.Volumes["pool/"+image] = virt.VolumeInfo{Pool: "pool", Name: image, Path: "/pools/pool/" + image, CapacityBytes: 1 << 30, Format: "qcow2"}
			f.LM.Spec.Image.Volume = &infrav1.VolumeReference{Name: tc.volume}
			fs := f.Scope()
			im := &wantingImporter{SyncImporter: servicetest.SyncImporter{Host: f.Host}}
			if err := servicetest.Reconcile(fs, infrav1.DiskReadyCondition, disk.New(fs.VM, fs.Host, im)); err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(im.wanted) != fmt.Sprint(tc.want) {
				t.Errorf("wanted %v, want %v", im.wanted, tc.want)
			}
		})
	}
}
