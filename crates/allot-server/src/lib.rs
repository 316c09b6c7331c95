//! allot-server
