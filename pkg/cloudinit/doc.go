// Package cloudinit builds the NoCloud seed image that hands a guest its
// bootstrap data on first boot.
//
// The seed is an ISO 9660 volume labelled "cidata" whose root directory holds
// user-data, meta-data and, when there are, network-config and vendor-data:
// what cloud-init's NoCloud data source looks for. It is built entirely in
// memory, because user-data carries the cluster's bootstrap secrets (join
// tokens, certificates) and must never land in a file on the controller's
// host.
//
// # File names
//
// Without Rock Ridge or Joliet an ISO 9660 directory record stores an
// identifier and a version, so the files are recorded as "meta-data;1",
// "network-config;1", "user-data;1" and "vendor-data;1" — byte for byte the
// identifiers that github.com/kdomanski/iso9660 v0.4.0 writes for these
// names (it lower-cases, keeps '-' and appends ";1"; isoinfo -l lists
// exactly these). cloud-init mounts the seed with the Linux isofs driver,
// whose default name mapping, map=normal, lower-cases an identifier and
// drops a trailing ";1" (isofs_name_translate in fs/isofs/dir.c), so the
// guest sees /user-data, /meta-data, /network-config and /vendor-data.
// Lower-case letters and '-' are outside ISO 9660's strict d-characters,
// but Linux, isoinfo and kdomanski's reader all accept them; the end-to-end
// test boots a real guest to prove that cloud-init reads the seed.
//
// # Why not kdomanski's ImageWriter
//
// In v0.4.0 ImageWriter.AddFile copies every file into a staging directory made
// by os.MkdirTemp and WriteTo reads it back from there, which would put the
// bootstrap secrets on disk. This package lays out the few sectors itself and
// reuses kdomanski's exported encoders for the primary volume descriptor and
// the directory records, so the encoding is the library's. It differs from
// the library's writer in two ways, both deliberate: it writes the path tables
// that ECMA-119 requires (the library leaves them empty, which Linux tolerates
// but stricter readers may not), and every timestamp is fixed, so the same
// Seed always yields the same bytes.
package cloudinit
