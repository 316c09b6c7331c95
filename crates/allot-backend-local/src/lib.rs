//! allot-backend-local
