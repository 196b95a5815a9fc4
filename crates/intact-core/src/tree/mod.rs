//! Authentication structures: the left-complete Merkle tree (MT-EINT), counter intervals
//! (write counters of file blocks) and the cache of verified Merkle nodes.

pub mod cache;
pub mod counters;
pub mod mac;
pub mod merkle;

pub use cache::{NodeCache, RunCheck, DEFAULT_CACHE_BYTES, NODE_COST};
pub use counters::{
    auth_ctr, check_ctr, touched_list, trusted_size, use_segments, CounterEdit, CounterError,
    CounterIntervals, SegHashes, TrustedCounters, SEG_BLOCKS, SEG_ENTER_PER_SEGMENT, SEG_GROUP,
    SEG_KEEP_PER_SEGMENT, SEG_MIN_INTERVALS, SEG_STRIDE,
};
pub use merkle::{
    ancestors, flat_index, flat_span, is_complete_node, peaks, stored_node_count, FileId, Hash,
    MerkleTree, NodeHasher, NodeIo, TreeError, TreeState, VecNodeIo, MAX_LEAVES, ZERO_HASH,
};
