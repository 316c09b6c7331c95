//! allot-store
