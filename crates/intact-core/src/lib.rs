//! intact-core: encrypted, authenticated and fresh storage on untrusted stores.
//!
//! Layers, top to bottom (see `docs/design.md`): the volume engine; schemes (one trait);
//! structures (Merkle tree, counter intervals, node cache); primitives; stores.
#![deny(missing_docs)]

pub mod attacks;
pub mod crypto;
pub mod disk;
pub mod entropy;
pub mod error;
pub mod format;
pub mod metrics;
pub mod scheme;
pub mod sign;
pub mod store;
pub mod tree;
pub mod tx;
pub mod volume;
pub mod wal;
pub mod wide;

pub use error::{Error, FsErrorKind, Result, Subject};
pub use volume::{CreateOptions, Options, Volume};
