//! allot-api
