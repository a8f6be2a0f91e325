//! The NBD server (in progress).
