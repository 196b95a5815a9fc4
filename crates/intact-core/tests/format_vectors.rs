//! Frozen test vectors of the on-disk format (docs/file-format.md, "Test vectors").
//!
//! Every value below is computed from fixed inputs (a fixed master key, a fixed file id)
//! and compared with a hex constant pasted from a first run.
//!
//! THESE CONSTANTS MUST NEVER CHANGE. If one of these tests fails, the change that made it
//! fail alters the on-disk format: existing volumes would stop opening (or, worse, open with
//! different keys). Revert the change, or introduce a new format version and keep these
//! vectors for version 1. Do not "fix" the test by pasting new values.
//!
//! The same vectors are reproduced in docs/file-format.md; keep both in sync.

use intact_core::crypto::{label, password_key, FileKeys, KdfParams, MasterKey};
use intact_core::format::{
    Anchor, AnchorLog, Config, Inode, Kind, ObjectNames, SchemeId, RECORD_SIZE,
};
use intact_core::store::{MemStore, UntrustedStore};
use intact_core::tree::{
    CounterIntervals, MerkleTree, NodeHasher, SegHashes, TreeState, TrustedCounters, VecNodeIo,
    SEG_BLOCKS, SEG_GROUP, SEG_STRIDE, ZERO_HASH,
};
use intact_core::tx::{JournalRef, Tx};
use intact_core::wal::{LogPos, LogRef};
use std::sync::Arc;

/// The fixed master key: the 32 ASCII bytes `0123456789abcdef0123456789abcdef` (the same
/// key as the unit test `crypto::tests::kdf_vectors_are_frozen`).
fn master() -> MasterKey {
    MasterKey::from_bytes(*b"0123456789abcdef0123456789abcdef")
}

/// The fixed file id: sixteen 0x07 bytes.
const FILE: [u8; 16] = [7; 16];

/// Compares every `(name, actual)` with its frozen value and reports all mismatches at once
/// (printing the actual values, for a reviewer to see what changed).
fn check(vectors: &[(&str, String, &str)]) {
    let mut bad = Vec::new();
    for (name, actual, frozen) in vectors {
        if actual != frozen {
            bad.push(format!("{name}:\n  frozen: {frozen}\n  actual: {actual}"));
        }
    }
    assert!(
        bad.is_empty(),
        "on-disk format changed:\n{}",
        bad.join("\n")
    );
}

fn hx(b: impl AsRef<[u8]>) -> String {
    hex::encode(b)
}

// ---------------------------------------------------------------------------------------
// Key derivation

#[test]
fn hkdf_labels() {
    let m = master();
    check(&[
        (
            "FILE_DATA (file id 07*16)",
            hx(m.derive(label::FILE_DATA, &FILE).expose_secret()),
            HKDF_FILE_DATA,
        ),
        (
            "FILE_IV (file id 07*16)",
            hx(m.derive(label::FILE_IV, &FILE).expose_secret()),
            HKDF_FILE_IV,
        ),
        (
            "LEAF",
            hx(m.derive(label::LEAF, &[]).expose_secret()),
            HKDF_LEAF,
        ),
        (
            "NODE",
            hx(m.derive(label::NODE, &[]).expose_secret()),
            HKDF_NODE,
        ),
        (
            "COUNTERS",
            hx(m.derive(label::COUNTERS, &[]).expose_secret()),
            HKDF_COUNTERS,
        ),
        (
            "ANCHOR",
            hx(m.derive(label::ANCHOR, &[]).expose_secret()),
            HKDF_ANCHOR,
        ),
        (
            "JOURNAL",
            hx(m.derive(label::JOURNAL, &[]).expose_secret()),
            HKDF_JOURNAL,
        ),
    ]);
    // The label strings themselves are part of the format.
    assert_eq!(label::FILE_DATA, "intact v1 file data encryption");
    assert_eq!(label::FILE_IV, "intact v1 file CBC IV PRF");
    assert_eq!(label::LEAF, "intact v1 Merkle leaf hash");
    assert_eq!(label::NODE, "intact v1 Merkle node hash");
    assert_eq!(label::COUNTERS, "intact v1 counter interval hash");
    assert_eq!(label::ANCHOR, "intact v1 trusted anchor MAC");
    assert_eq!(label::JOURNAL, "intact v1 journal digest");
}

const HKDF_FILE_DATA: &str = "ab4a7794e2a7f417700c4694fba1f40018aa12e7d4d81c9d5f8c13882f6b0e8c";
const HKDF_FILE_IV: &str = "26d9be1bd6f4161cc9781b4e8b34c1cbc712c3cced070011a7eea6c4db9ead70";
const HKDF_LEAF: &str = "d570bf29fa17370d566a08ae7ba53278db41af197e004ddacf7ec1c538519dac";
const HKDF_NODE: &str = "c12a321c93a67b3ca74d453230c81d573022ee20fa0ab2e25c849c64f3012a0a";
const HKDF_COUNTERS: &str = "7eaf3f7b36b646d883e4d77eea4ec0166212a73f25d68dd8a59849236942d1e8";
const HKDF_ANCHOR: &str = "0586637e435753b87a677951a483776152328e07f1ae4ef48915238bf29efed7";
const HKDF_JOURNAL: &str = "13eab811d8bde84fd705c29682cde51182e12dd1f78b127a0bbf4831e8c1f86e";

#[test]
fn argon2id_password_key_and_config_aad() {
    // Argon2id v0x13, m = 64 KiB, t = 1, p = 1 (KdfParams::TEST), 32-byte output.
    let kek = password_key(b"correct horse", &[0x5a; 16], KdfParams::TEST).unwrap();
    let config = Config {
        format: 1,
        volume_id: "11".repeat(16),
        block_size: 4096,
        scheme: "mt-eint".into(),
        kdf: KdfParams::DEFAULT,
        salt: "5a".repeat(16),
        features: vec![],
        wrapped_key: String::new(),
    };
    assert_eq!(
        String::from_utf8(config.aad()).unwrap(),
        "intact-config|1|11111111111111111111111111111111|4096|mt-eint|65536|3|1|\
         5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a|"
    );
    check(&[(
        "Argon2id(TEST) password key",
        hx(kek.expose_secret()),
        ARGON2_TEST_KEK,
    )]);
}

const ARGON2_TEST_KEK: &str = "01544eba8938839cf1949fd11b700af2689d6be3eefb0e0634e0bb9051467eab";

// ---------------------------------------------------------------------------------------
// Block encryption and leaves

#[test]
fn block_nonce_iv_tag_and_leaf() {
    let m = master();
    let keys = FileKeys::derive(&m, &FILE);
    // GCM nonce of block 5 at counter 9: index u32 LE || ctr u64 LE.
    assert_eq!(hx(FileKeys::nonce(5, 9)), "050000000900000000000000");
    // mt-eint (GCM) tag of block 5 at counter 9 over a 32-byte plaintext of 0x41 bytes,
    // AAD "intactM1" || file id || index u64 LE. The leaf is the tag || 16 zero bytes.
    let mut aad = Vec::new();
    aad.extend_from_slice(b"intactM1");
    aad.extend_from_slice(&FILE);
    aad.extend_from_slice(&5u64.to_le_bytes());
    let mut ct = vec![0x41u8; 32];
    let tag = keys.gcm().seal(FileKeys::nonce(5, 9), &aad, &mut ct);
    // aead-scheme record of block 5 with a fixed nonce 0x0c*12 (in real use the nonce is
    // random): nonce || ct || tag, AAD "intactA1" || file id || index u64 LE.
    let mut aad_a = Vec::new();
    aad_a.extend_from_slice(b"intactA1");
    aad_a.extend_from_slice(&FILE);
    aad_a.extend_from_slice(&5u64.to_le_bytes());
    let mut ct_a = vec![0x41u8; 32];
    let tag_a = keys.gcm().seal([0x0c; 12], &aad_a, &mut ct_a);
    let mut rec_a = vec![0x0c; 12];
    rec_a.extend_from_slice(&ct_a);
    rec_a.extend_from_slice(&tag_a);
    // mt-eint-cbc: IV of block 5 at counter 9, ciphertext of the same plaintext, leaf.
    let iv = keys.cbc_iv(5, 9);
    let mut cbc = vec![0x41u8; 32];
    keys.cbc().encrypt(iv, &mut cbc);
    let leaf_key = m.derive(label::LEAF, &[]);
    let leaf = leaf_key.mac(&[
        b"leaf",
        &FILE,
        &5u64.to_le_bytes(),
        &9u64.to_le_bytes(),
        &[0x41u8; 32],
    ]);
    // Spilled counter hash: keyed BLAKE3 (COUNTERS key) over "ctrs" || file id || array.
    let ctr_key = m.derive(label::COUNTERS, &[]);
    let starts: Vec<u8> = [0u64, 3].iter().flat_map(|s| s.to_le_bytes()).collect();
    let h_starts = ctr_key.mac(&[b"ctrs", &FILE, &starts]);
    check(&[
        ("GCM ciphertext (mt-eint)", hx(&ct), GCM_CT),
        ("GCM tag (mt-eint)", hx(tag), GCM_TAG),
        ("aead record", hx(&rec_a), AEAD_RECORD),
        ("CBC IV", hx(iv), CBC_IV),
        ("CBC ciphertext", hx(&cbc), CBC_CT),
        ("CBC leaf", hx(leaf), CBC_LEAF),
        ("counter array hash h([0,3])", hx(h_starts), CTR_HASH),
    ]);
}

const GCM_CT: &str = "30fa72ea8c6770f8f111e119d12d44dc306cfb560fd9df15cd0621d646cf4259";
const GCM_TAG: &str = "e2877d216a7978bac4bb308698b5868e";
const AEAD_RECORD: &str = "0c0c0c0c0c0c0c0c0c0c0c0ca6ae397fdff5c712c44733ae3923dc12d3572e7d89e67c54e4355859c2ab912074ac5a658a10b3902a5bda0d415a85f9";
const CBC_IV: &str = "2658afe7b3d36c6f02007bf03f82f1a0";
const CBC_CT: &str = "39bfd302b71798a1aa2448ef9d610699b80375f118880f4f6b371df3ede7ba95";
const CBC_LEAF: &str = "26a28dbcfa76f5be9a759a3eb86b82731286ebed48a3f9ce1ff5af0e84516eac";
const CTR_HASH: &str = "9e7b4d1097cdbe4bb552933ab7ef36601c698eb93e708c5c94dc5e63a3d641b0";

// ---------------------------------------------------------------------------------------
// Merkle tree

/// Leaf `i` of the example tree: 32 bytes of value `i + 1`.
fn leaf(i: u8) -> [u8; 32] {
    [i + 1; 32]
}

#[test]
fn merkle_hashes_and_flat_layout() {
    let node_key = master().derive(label::NODE, &[]);
    let h = NodeHasher::new(*node_key.expose_secret());
    let (l0, l1, l2) = (leaf(0), leaf(1), leaf(2));
    // Three leaves: peaks (0, height 1) and (2, height 0).
    let n01 = h.node(&FILE, 1, &l0, &l1);
    let spine = h.spine(&FILE, 0, 3, &n01, &l2);
    let root = h.root(&FILE, 3, &spine);
    let empty = h.empty_root(&FILE);
    // Zero rule: a complete node over two all-zero children (a subtree of holes) is the
    // all-zero hash, not hashed; spines and roots are always hashed.
    assert_eq!(h.node(&FILE, 1, &ZERO_HASH, &ZERO_HASH), ZERO_HASH);
    assert_ne!(h.node(&FILE, 1, &l0, &ZERO_HASH), ZERO_HASH);
    assert_ne!(h.spine(&FILE, 0, 3, &ZERO_HASH, &ZERO_HASH), ZERO_HASH);
    assert_eq!(h.root_from_peaks(&FILE, 3, &[(0, n01), (2, l2)]), root);
    let one = h.root(&FILE, 1, &l0);
    // The same tree built through the public append path: stored in flat layout.
    let t = MerkleTree::new(&h, FILE, None);
    let mut ts = TreeState::empty(&h, &FILE);
    assert_eq!(ts.root, empty);
    let mut io = VecNodeIo::default();
    t.append(&mut ts, &mut io, &[l0, l1, l2]).unwrap();
    assert_eq!(ts, TreeState { leaves: 3, root });
    assert_eq!(t.root_of(&[l0, l1, l2]), root);
    // .m holds 2n - 1 = 5 nodes: flat 0 = L0, 1 = N(0,1), 2 = L1, 3 = hole, 4 = L2.
    assert_eq!(io.0.len(), 5);
    assert_eq!((io.0[0], io.0[1], io.0[2], io.0[4]), (l0, n01, l1, l2));
    assert_eq!(io.0[3], ZERO_HASH);
    check(&[
        ("node(flat 1, L0, L1)", hx(n01), MERKLE_NODE),
        ("spine(start 0, n 3, N01, L2)", hx(spine), MERKLE_SPINE),
        ("root(n 3, spine)", hx(root), MERKLE_ROOT3),
        ("root(n 1, L0)", hx(one), MERKLE_ROOT1),
        ("empty root", hx(empty), MERKLE_EMPTY),
    ]);
}

const MERKLE_NODE: &str = "4b60abe8f27b8bd83febde1d30e9e3ec7716c713d2982356f9fefe94f67a93e1";
const MERKLE_SPINE: &str = "8fbcbab2ba4e9fc7f53adc1b4f4b3779684b10217944307341edfd3e5b0d7231";
const MERKLE_ROOT3: &str = "c20d35b3f366e1b526e6af1502953d77adef4ca79aeec3ad885c2403f859eea9";
const MERKLE_ROOT1: &str = "5ab4c5eea1a1cf42ee35cf97c414a52e9bc2740c75c1dd4a1980c80cb46ab8ac";
const MERKLE_EMPTY: &str = "b9c9faa73405e37a0b53e4122cc9dcc4fd8a0cc0ac6bf9e7b84e850016de1b8c";

// ---------------------------------------------------------------------------------------
// Records

/// The example inode: a 10,000-byte mt-eint file of 3 blocks, written at counter 5.
fn example_inode() -> Inode {
    let mut counters = CounterIntervals::new();
    counters.set_range(0, 3, 5);
    Inode {
        kind: Kind::File,
        scheme: SchemeId::MtEintGcm,
        mode: 0o644,
        uid: 1000,
        gid: 100,
        nlink: 1,
        auto: false,
        scheme_set: false,
        xattr: 9,
        size: 10_000,
        mtime_ns: 1_700_000_000_123_456_789,
        ctime_ns: 1_700_000_000_987_654_321,
        atime_ns: 1_700_000_000_555_555_555,
        id: FILE,
        tree: TreeState {
            leaves: 3,
            root: [0xab; 32],
        },
        ctr_hw: 2,
        link: 0,
        counters: TrustedCounters::Inline(counters),
        inline_node: None,
        inline_mac: None,
        inline_tags: None,
        inline_data: None,
    }
}

/// An `mt-eint` GCM leaf: its tag (here 16 bytes of `b`) and 16 zero bytes.
fn leaf_of_tag(b: u8) -> [u8; 32] {
    let mut l = [0u8; 32];
    l[..16].fill(b);
    l
}

#[test]
fn inode_record() {
    let ino = example_inode();
    let b = ino.encode();
    assert_eq!(b.len(), RECORD_SIZE);
    assert_eq!(Inode::decode(&b).as_ref(), Some(&ino));
    // The same inode with spilled counters (the arrays live in .c).
    let mut sp = ino.clone();
    sp.counters = TrustedCounters::Spilled {
        intervals: 9,
        blocks: 3000,
        h_starts: [0xcc; 32],
        h_ctrs: [0xdd; 32],
    };
    let bs = sp.encode();
    assert_eq!(Inode::decode(&bs).as_ref(), Some(&sp));
    assert_eq!(b[..128], bs[..128]);
    // Spilled .c object of intervals starts [0, 3], counters [5, 6] over 4 blocks.
    let mut c = CounterIntervals::new();
    c.set_range(0, 4, 5);
    c.set_range(3, 1, 6);
    check(&[
        ("inode record (inline counters)", hx(b), INODE_INLINE),
        (
            "trusted counters (spilled), record bytes 128..256",
            hx(&bs[128..]),
            TCTR_SPILLED,
        ),
        (".c encoding", hx(c.encode()), CTRS_OBJECT),
        (
            "free record linking to 7",
            hx(Inode::free(7).encode()),
            INODE_FREE,
        ),
    ]);
    // A one-block file on a volume with inline leaves: flag bit 2, its tree's node in bytes
    // 224..256 (docs/file-format.md §4). The frozen bytes are composed by hand, field by
    // field, not by the encoder.
    let mut one = ino.clone();
    one.size = 1000;
    one.tree.leaves = 1;
    let mut c1 = CounterIntervals::new();
    c1.set_range(0, 1, 5);
    one.counters = TrustedCounters::Inline(c1);
    one.inline_node = Some([0xee; 32]);
    let by_hand = [
        "01020400a4010000e8030000640000000100000009000000e803000000000000",
        "15cd853dfe9c9717b1680871fe9c9717e31a4757fe9c97170707070707070707",
        "07070707070707070100000000000000abababababababababababababababab",
        "abababababababababababababababab02000000000000000000000000000000",
        // tag 0, 1 interval, 1 block, start 0, counter 5, 3 bytes of zero
        "0001000000010000000000000000000000000000000500000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee",
    ]
    .concat();
    assert_eq!(
        hx(one.encode()),
        by_hand,
        "inode record with an inline node"
    );
    assert_eq!(Inode::decode(&one.encode()).as_ref(), Some(&one));
    // The flags byte (record byte 2): bit 0 auto, bit 1 scheme_set, bit 2 inline node; the
    // rest of the record does not move.
    for (auto, set, inline, byte) in [
        (true, false, false, 0x01),
        (false, true, false, 0x02),
        (true, true, false, 0x03),
        (true, true, true, 0x07),
        (false, true, true, 0x06),
    ] {
        let mut r = if inline { one.clone() } else { ino.clone() };
        r.auto = auto;
        r.scheme_set = set;
        let e = r.encode();
        assert_eq!(e[2], byte, "auto {auto}, scheme_set {set}, inline {inline}");
        let base = if inline { one.encode() } else { ino.encode() };
        assert_eq!((&e[..2], &e[3..]), (&base[..2], &base[3..]));
        assert_eq!(Inode::decode(&e).as_ref(), Some(&r));
    }
    // TS_F in use (paper Table 4's trusted storage; docs/file-format.md §4): the scheme
    // byte and block count (9), the root (32), ctr_hw (8), the inline counters (13 + 16
    // per interval), and the inline node (32) when the record holds one.
    assert_eq!(ino.trusted_bytes_used(), 9 + 32 + 8 + 13 + 16);
    assert_eq!(one.trusted_bytes_used(), 9 + 32 + 8 + 13 + 16 + 32);
    assert_eq!(sp.trusted_bytes_used(), 9 + 32 + 8 + 77);
    let mut aead = ino.clone();
    aead.scheme = SchemeId::Aead;
    assert_eq!(aead.trusted_bytes_used(), 9);
    let mut none = ino.clone();
    none.scheme = SchemeId::None;
    assert_eq!(none.trusted_bytes_used(), 9 + 8 + 13 + 16);
    let mut mac = ino.clone();
    mac.scheme = SchemeId::MacTree;
    assert_eq!(mac.trusted_bytes_used(), 27);
    // A one-block mac-tree file on a volume with inline mac-tree leaves: flag bit 2, TS_F
    // (m 1, root counter 7, depth 1, arity 2^6) in 80..112, the empty counter form, and
    // N_0 || node 0's tag || T_0 in 216..256 (docs/file-format.md §4, §7.6). By hand.
    let mut m1 = one.clone();
    m1.scheme = SchemeId::MacTree;
    m1.ctr_hw = 0;
    m1.counters = TrustedCounters::Inline(CounterIntervals::new());
    m1.tree.root = intact_core::scheme::MacTreeState {
        m: 1,
        depth: 1,
        arity_log2: 6,
        root: 7,
    }
    .encode();
    m1.inline_node = None;
    let mut leaf = [0x22u8; 40];
    leaf[..8].copy_from_slice(&7u64.to_le_bytes());
    leaf[8..24].fill(0x11);
    m1.inline_mac = Some(leaf);
    let by_hand = [
        "01080400a4010000e8030000640000000100000009000000e803000000000000",
        "15cd853dfe9c9717b1680871fe9c9717e31a4757fe9c97170707070707070707",
        // id, leaves 1, m 1, root counter 7
        "0707070707070707010000000000000001000000000000000700000000000000",
        // depth 1, log2 arity 6, 14 zero bytes; ctr_hw 0; link 0
        "0106000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        // the empty counter form ends the zeros; N_0 = 7 at 216
        "0000000000000000000000000000000000000000000000000700000000000000",
        "1111111111111111111111111111111122222222222222222222222222222222",
    ]
    .concat();
    assert_eq!(
        hx(m1.encode()),
        by_hand,
        "mac-tree record with an inline leaf"
    );
    assert_eq!(Inode::decode(&m1.encode()).as_ref(), Some(&m1));
    assert_eq!(m1.trusted_bytes_used(), 9 + 18 + 40);
    // The same bytes read as another scheme's record are an inline Merkle node (224..256)
    // over counters that end at 224: never the mac-tree form.
    let mut other = m1.encode();
    other[1] = 2;
    let read = Inode::decode(&other);
    assert!(
        read.as_ref().is_none_or(|r| r.inline_mac.is_none()),
        "{read:?}"
    );
    // Flag bit 2 with counters that reach into bytes 224..256 is refused, not misread.
    let mut bad = one.encode();
    bad[129] = 6; // six intervals: 13 + 96 bytes, past byte 224
    assert_eq!(Inode::decode(&bad), None);
    // The example (three blocks, one interval) on a volume with inline trees: flag bit 3,
    // the three leaves' GCM tags in 208..256, the counters before them (docs/file-format.md
    // §4). By hand.
    let mut tags = ino.clone();
    tags.inline_tags = intact_core::format::InlineTags::of(&[
        leaf_of_tag(0x31),
        leaf_of_tag(0x32),
        leaf_of_tag(0x33),
    ]);
    assert!(tags.inline_tags.is_some());
    let by_hand = [
        // kind 1, scheme 2, flags 0x08, mode 0644, uid 1000, gid 100, nlink 1, xattr 9,
        // size 10,000
        "01020800a4010000e80300006400000001000000090000001027000000000000",
        "15cd853dfe9c9717b1680871fe9c9717e31a4757fe9c97170707070707070707",
        // id, leaves 3, root
        "07070707070707070300000000000000abababababababababababababababab",
        // root, ctr_hw 2, link 0
        "abababababababababababababababab02000000000000000000000000000000",
        // tag 0, 1 interval, 3 blocks, start 0, counter 5, 3 bytes of zero
        "0001000000030000000000000000000000000000000500000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        // zeros to 208, then the tag of leaf 0
        "0000000000000000000000000000000031313131313131313131313131313131",
        // the tags of leaves 1 and 2
        "3232323232323232323232323232323233333333333333333333333333333333",
    ]
    .concat();
    assert_eq!(
        hx(tags.encode()),
        by_hand,
        "inode record with inline leaves"
    );
    assert_eq!(Inode::decode(&tags.encode()).as_ref(), Some(&tags));
    assert_eq!(tags.trusted_bytes_used(), 9 + 32 + 8 + 13 + 16 + 48);
    // Flag bit 3 is refused where the record cannot hold it: a tree of one leaf or of
    // seven, another scheme, with flag bit 2, or counters that reach into the tags.
    for (what, edit) in [
        ("one leaf", (72usize, 1u8)),
        ("seven leaves", (72, 7)),
        ("CBC", (1, 3)),
        ("mac-tree", (1, 8)),
        ("flag bit 2 too", (2, 0x0c)),
        ("five intervals", (129, 5)),
    ] {
        let mut bad = tags.encode();
        bad[edit.0] = edit.1;
        assert_eq!(Inode::decode(&bad), None, "{what}");
    }
    assert_eq!(
        ObjectNames::of(&FILE).data,
        "f/07/07070707070707070707070707070707.d"
    );
    assert_eq!(
        ObjectNames::of(&FILE).meta,
        "f/07/07070707070707070707070707070707.m"
    );
    assert_eq!(
        ObjectNames::of(&FILE).ctrs,
        "f/07/07070707070707070707070707070707.c"
    );
}

const INODE_INLINE: &str = "01020000a4010000e8030000640000000100000009000000102700000000000015cd853dfe9c9717b1680871fe9c9717e31a4757fe9c9717070707070707070707070707070707070300000000000000abababababababababababababababababababababababababababababababab020000000000000000000000000000000001000000030000000000000000000000000000000500000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000";
const TCTR_SPILLED: &str = "0109000000b80b000000000000ccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccdddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000";
const CTRS_OBJECT: &str =
    "0200000004000000000000000000000000000000030000000000000005000000000000000600000000000000";
const INODE_FREE: &str = "00010000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000007000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000";

/// A 300-byte `mt-eint` file in slots of the inode table (docs/file-format.md §4.3): the
/// example inode with its data in slots 40 and 41 (flag bit 4, tag 2 and the count at 128,
/// the slots at 136), and slot 41's record holding bytes 248..300 (`0x5a`).
#[test]
fn inline_data_record_and_slot() {
    let mut rec = example_inode();
    rec.size = 300;
    rec.tree = TreeState {
        leaves: 0,
        root: [0xcd; 32],
    };
    rec.ctr_hw = 0;
    rec.counters = TrustedCounters::Inline(CounterIntervals::new());
    rec.inline_data = Some(intact_core::format::InlineData {
        slots: vec![40, 41],
        bytes: Vec::new(),
    });
    let b = rec.encode();
    let slot = intact_core::format::encode_slot(&[0x5a; 52]);
    check(&[
        (
            "inline record 0..128",
            hx(&b[..128]),
            concat!(
                "01021000a4010000e80300006400000001000000090000002c01000000000000",
                "15cd853dfe9c9717b1680871fe9c9717e31a4757fe9c97170707070707070707",
                "07070707070707070000000000000000cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd",
                "cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd00000000000000000000000000000000"
            ),
        ),
        (
            "inline record 128..256",
            hx(&b[128..]),
            concat!(
                "0202000000000000280000000000000029000000000000000000000000000000",
                "0000000000000000000000000000000000000000000000000000000000000000",
                "0000000000000000000000000000000000000000000000000000000000000000",
                "0000000000000000000000000000000000000000000000000000000000000000"
            ),
        ),
        (
            "slot",
            hx(slot),
            concat!(
                "09000000000000005a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a",
                "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a00000000",
                "0000000000000000000000000000000000000000000000000000000000000000",
                "0000000000000000000000000000000000000000000000000000000000000000",
                "0000000000000000000000000000000000000000000000000000000000000000",
                "0000000000000000000000000000000000000000000000000000000000000000",
                "0000000000000000000000000000000000000000000000000000000000000000",
                "0000000000000000000000000000000000000000000000000000000000000000"
            ),
        ),
    ]);
    assert_eq!(Inode::decode(&b), Some(rec));
}

#[test]
fn anchor_record() {
    let key = master().derive(label::ANCHOR, &[]);
    let a = Anchor {
        volume_id: [0x11; 16],
        epoch: 42,
        ctr_next: 1 + 3 * (1 << 32),
        journal: Some(JournalRef {
            slot: 1,
            len: 123,
            digest: [0x22; 32],
        }),
        applied: false,
        log: Some(AnchorLog {
            sealed: LogRef {
                start: LogPos {
                    seg: 1 + 2 * (1 << 32),
                    off: 27,
                },
                end: LogPos {
                    seg: 2 + 2 * (1 << 32),
                    off: 4096,
                },
            },
            tail: true,
        }),
        itable: example_inode(),
    };
    let b = a.encode(&key);
    assert_eq!(b.len(), 402);
    assert_eq!(Anchor::decode(&b, &key).unwrap(), a);
    let none = Anchor {
        journal: None,
        ..a.clone()
    };
    let bn = none.encode(&key);
    assert_eq!(Anchor::decode(&bn, &key).unwrap(), none);
    let no_tail = Anchor {
        log: a.log.map(|l| AnchorLog { tail: false, ..l }),
        ..a.clone()
    };
    let bt = no_tail.encode(&key);
    assert_eq!(Anchor::decode(&bt, &key).unwrap(), no_tail);
    assert_eq!(bt[81], 3, "flags: a log, no tail");
    let applied = Anchor {
        applied: true,
        ..a.clone()
    };
    let ba = applied.encode(&key);
    assert_eq!(Anchor::decode(&ba, &key).unwrap(), applied);
    assert_eq!(ba[81], 5, "flags: a log, its journal applied");
    let applied_no_log = Anchor {
        log: None,
        ..applied.clone()
    };
    let bl = applied_no_log.encode(&key);
    assert_eq!(Anchor::decode(&bl, &key).unwrap(), applied_no_log);
    check(&[
        ("anchor (journal in slot 1, a log)", hx(&b), ANCHOR),
        (
            "anchor MAC (no journal)",
            hx(&bn[bn.len() - 32..]),
            ANCHOR_NO_JOURNAL_MAC,
        ),
    ]);
    // An anchor of format 1 (before the log) still reads, naming no log.
    let v1 = hex::decode(ANCHOR_V1).unwrap();
    let old = Anchor::decode(&v1, &key).unwrap();
    assert_eq!(old, Anchor { log: None, ..a });
    // A flipped log flag fails the MAC.
    let mut bad = b.clone();
    bad[81] ^= 2;
    assert!(Anchor::decode(&bad, &key).is_err());
}

/// Frozen in format 1, before the log: still read.
const ANCHOR_V1: &str = "494e54414e434831111111111111111111111111111111112a000000000000000100000003000000017b00000000000000222222222222222222222222222222222222222222222222222222222222222201020000a4010000e8030000640000000100000009000000102700000000000015cd853dfe9c9717b1680871fe9c9717e31a4757fe9c9717070707070707070707070707070707070300000000000000abababababababababababababababababababababababababababababababab020000000000000000000000000000000001000000030000000000000000000000000000000500000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000b9afd0e6a38a8ee815cb570bf652cf438a869786e7b97dca7f2ada9a0a9c5a07";
const ANCHOR: &str = "494e54414e434832111111111111111111111111111111112a000000000000000100000003000000017b0000000000000022222222222222222222222222222222222222222222222222222222222222220101000000020000001b000000000000000200000002000000001000000000000001020000a4010000e8030000640000000100000009000000102700000000000015cd853dfe9c9717b1680871fe9c9717e31a4757fe9c9717070707070707070707070707070707070300000000000000abababababababababababababababababababababababababababababababab02000000000000000000000000000000000100000003000000000000000000000000000000050000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000090089030448398dcdc9a6ff1e1c6f5190b3380ad3ddcc3c160c51bc8411f7892";
const ANCHOR_NO_JOURNAL_MAC: &str =
    "ab20458f04647008ed1d192ae223f53d4ef94925c9ce3f43a0888b69f80aafab";

/// A journal of an overwrite that also grows a data object (its closing length set), and a
/// deletion; then the same overwrite of an object whose length stays the store's (an open
/// end: docs/file-format.md §6, no `SetLen`).
#[test]
fn journal_encoding() {
    let key = master().derive(label::JOURNAL, &[]);
    let journal = |len: usize, grow: bool| {
        let store = Arc::new(MemStore::new());
        store.write_at("a.d", 0, &vec![0u8; len]).unwrap();
        store.write_at("b.m", 0, &[0u8; 4]).unwrap();
        let mut tx = Tx::new(store.clone());
        tx.write_at("a.d", 2, b"wxyz").unwrap();
        if grow {
            tx.set_len("a.d", 8).unwrap();
        }
        tx.delete("b.m").unwrap();
        let p = tx.prepare(&key, 5, None).unwrap();
        let r = p.journal().unwrap();
        let bytes = store.read_all("journal.0").unwrap().unwrap();
        assert_eq!((r.slot, r.len), (0, bytes.len() as u64));
        (bytes, r.digest)
    };
    let (closed, digest) = journal(6, true);
    let (open, open_digest) = journal(8, false);
    assert_eq!((closed.len(), open.len()), (62, 48));
    check(&[
        ("journal.0", hx(&closed), JOURNAL),
        ("journal digest", hx(digest), JOURNAL_DIGEST),
        ("journal.0 (open end)", hx(&open), JOURNAL_OPEN_END),
        (
            "journal digest (open end)",
            hx(open_digest),
            JOURNAL_OPEN_END_DIGEST,
        ),
    ]);
}

const JOURNAL: &str = "494e544a524e4c31050000000000000003000000010300612e640200000000000000040000007778797a020300612e640800000000000000030300622e6d";
const JOURNAL_DIGEST: &str = "8e3db6ad804b6a35b38af543cd1d0a78093b65bff98b9f39c669255c29a76b0e";
const JOURNAL_OPEN_END: &str = "494e544a524e4c31050000000000000002000000010300612e640200000000000000040000007778797a030300622e6d";
const JOURNAL_OPEN_END_DIGEST: &str =
    "7211bb39cbb588ab019d34b40f6f145d67138219e8efecc67d3e01095f9204e6";

// ---------------------------------------------------------------------------------------
// Worked example of docs/file-format.md: object sizes of a 10,000-byte file at 4 KiB blocks.

mod common;

#[test]
fn worked_example_object_sizes() {
    use intact_core::store::MemTrusted;
    for (scheme, d, m) in [
        (SchemeId::Aead, 3 * (12 + 4096 + 16), None),
        // Under GCM the three leaves' tags are in the record (`inline-tree`): no `.m`.
        (SchemeId::MtEintGcm, 3 * 4096, None),
        (SchemeId::MtEintCbc, 3 * 4096, Some(5 * 32)),
    ] {
        let store = Arc::new(MemStore::new());
        let trusted = MemTrusted::new();
        let vol = common::create(store.clone(), &trusted, scheme, 4096);
        vol.create_file("/f", None).unwrap();
        vol.write_path("/f", 0, &common::pattern(1, 10_000))
            .unwrap();
        vol.sync().unwrap();
        let names = common::names(&vol, "/f");
        let st = vol.stat("/f").unwrap();
        assert_eq!(
            (st.blocks, st.counter_intervals, st.counters_spilled),
            (3, u64::from(scheme.fresh()), false)
        );
        assert_eq!(
            store.len(&names.data).unwrap(),
            Some(d),
            "{}",
            scheme.name()
        );
        assert_eq!(store.len(&names.meta).unwrap(), m, "{}", scheme.name());
        assert_eq!(store.len(&names.ctrs).unwrap(), None, "{}", scheme.name());
        let anchor = trusted.snapshot().unwrap();
        assert_eq!(anchor.len(), 402);
        assert_eq!(store.read_all("anchor.copy").unwrap().unwrap(), anchor);
    }
}

// ---------------------------------------------------------------------------------------
// Schemes `none` (code 4) and `mac-tree` (code 8)

struct MacVecIo(std::collections::HashMap<&'static str, Vec<u8>>);

impl intact_core::tree::mac::MacIo for MacVecIo {
    fn read(
        &mut self,
        obj: intact_core::tree::mac::Obj,
        off: u64,
        buf: &mut [u8],
    ) -> intact_core::Result<()> {
        let v = self.0.entry(mac_obj(obj)).or_default();
        buf.fill(0);
        for (k, b) in buf.iter_mut().enumerate() {
            if let Some(x) = v.get(off as usize + k) {
                *b = *x;
            }
        }
        Ok(())
    }
    fn write(
        &mut self,
        obj: intact_core::tree::mac::Obj,
        off: u64,
        data: &[u8],
    ) -> intact_core::Result<()> {
        let v = self.0.entry(mac_obj(obj)).or_default();
        let end = off as usize + data.len();
        if v.len() < end {
            v.resize(end, 0);
        }
        v[off as usize..end].copy_from_slice(data);
        Ok(())
    }
}

fn mac_obj(o: intact_core::tree::mac::Obj) -> &'static str {
    match o {
        intact_core::tree::mac::Obj::Leaves => "m",
        intact_core::tree::mac::Obj::Upper => "c",
    }
}

#[test]
fn mac_tree_and_none_vectors() {
    use intact_core::tree::mac::{nonce, MacTree, MacTreeState, NONCE_ENC, NONCE_MAC};
    let m = master();
    let keys = FileKeys::derive(&m, &FILE);
    // Scheme codes and names.
    assert_eq!(SchemeId::None.code(), 4);
    assert_eq!(SchemeId::MacTree.code(), 8);
    assert_eq!(SchemeId::from_code(4), Some(SchemeId::None));
    assert_eq!(SchemeId::from_code(8), Some(SchemeId::MacTree));
    assert_eq!(SchemeId::parse("none").unwrap(), SchemeId::None);
    assert_eq!(SchemeId::parse("mac-tree").unwrap(), SchemeId::MacTree);
    // Block 5, counter 9, plaintext 32 x 0x41 (as in the block vectors above).
    let mut ct = [0x41u8; 32];
    keys.ctr().xor(nonce(NONCE_ENC, 5, 0, 9), &mut ct);
    let tree = MacTree {
        file: FILE,
        mac: keys.mac(),
        cache: None,
    };
    let block_tag = tree.block_tag(5, 9, &ct);
    // A level-0 node of the default 64-ary tree: counters [9, 0, ..., 0] under parent 3.
    let mut node = vec![0u8; 8 * 64];
    node[0] = 9;
    let node_tag = keys.mac().mac(&nonce(NONCE_MAC, 0, 1, 3), &node);
    // `none` encrypts exactly like mt-eint-cbc (IV = PRF(i || ctr), AES-256-CBC).
    let mut none_ct = [0x41u8; 32];
    keys.cbc().encrypt(keys.cbc_iv(5, 9), &mut none_ct);
    // The trusted state in the record's root field.
    let ts = MacTreeState {
        m: 65,
        depth: 2,
        arity_log2: 6,
        root: 99,
    };
    // A whole 2-ary tree of 3 leaves written at counter 5 (session floor 1).
    let mut io = MacVecIo(Default::default());
    let ts3 = tree
        .update(
            &MacTreeState::empty(1),
            &mut io,
            0,
            3,
            1,
            1 << 40,
            &mut |_| Ok(()),
            &mut |i, _| (5, Some([0x10 + i as u8; 16])),
        )
        .unwrap();
    check(&[
        (
            "MAC_TREE_AES (file id 07*16)",
            hx(m.derive(label::MAC_TREE_AES, &FILE).expose_secret()),
            HKDF_MAC_TREE_AES,
        ),
        (
            "MAC_TREE_POLY (file id 07*16)",
            hx(m.derive(label::MAC_TREE_POLY, &FILE).expose_secret()),
            HKDF_MAC_TREE_POLY,
        ),
        (
            "encryption nonce <5, 0, 9>_e",
            hx(nonce(NONCE_ENC, 5, 0, 9)),
            "09000000000000000500000001000000",
        ),
        (
            "block MAC nonce <5, 0, 9>_a",
            hx(nonce(NONCE_MAC, 5, 0, 9)),
            "09000000000000000500000002000000",
        ),
        (
            "node MAC nonce <0, 1, 3>_a",
            hx(nonce(NONCE_MAC, 0, 1, 3)),
            "03000000000000000000000002000001",
        ),
        ("mac-tree ciphertext", hx(ct), MAC_TREE_CT),
        ("mac-tree block tag", hx(block_tag), MAC_TREE_BLOCK_TAG),
        ("mac-tree node tag", hx(node_tag), MAC_TREE_NODE_TAG),
        ("none ciphertext (= mt-eint-cbc)", hx(none_ct), CBC_CT),
        ("mac-tree TS_F (root field)", hx(ts.encode()), MAC_TREE_TS),
        ("2-ary tree TS_F", hx(ts3.encode()), MAC_TREE_TS3),
        ("2-ary tree .m", hx(&io.0["m"]), MAC_TREE_M3),
        ("2-ary tree .c", hx(&io.0["c"]), MAC_TREE_C3),
    ]);
}
const HKDF_MAC_TREE_AES: &str = "395aad76f4fcb2355207e892eeeacd0c405335c2a52b9ba303d4f2437f112d6e";
const HKDF_MAC_TREE_POLY: &str = "4749673abe8670880e7add8789bbccc20107f26d992eb06066579533c7f7f1e6";
const MAC_TREE_CT: &str = "87d3e1680253254ca2e9eb2fc5be60e0f24b8f8e0a49a02abb5c201ac0e2fecd";
const MAC_TREE_BLOCK_TAG: &str = "2b87a7e00f8b178b2718eff912a63173";
const MAC_TREE_NODE_TAG: &str = "723e79a6d88bce2685e5bd86c3cb1d37";
const MAC_TREE_TS: &str = "4100000000000000630000000000000002060000000000000000000000000000";
const MAC_TREE_TS3: &str = "0300000000000000010000000000000002010000000000000000000000000000";
const MAC_TREE_M3: &str = "05000000000000000500000000000000139d12cd340115a065d285fa9d408304101010101010101010101010101010101111111111111111111111111111111105000000000000000000000000000000de54284a33329f7c933820951bb53c1c12121212121212121212121212121212";
const MAC_TREE_C3: &str = "01000000000000000100000000000000e1f1a2dd28960499cd40b6f1c7255578";

// rand-eint and comp-eint (schemes 5, 6, 7)

/// A file state and environment with the fixed keys, 128-byte blocks, counter floor 9.
fn fixed_file(
    scheme: SchemeId,
) -> (
    intact_core::scheme::FileState,
    NodeHasher,
    intact_core::crypto::SubKey,
) {
    let m = master();
    let hasher = NodeHasher::new(*m.derive(label::NODE, &[]).expose_secret());
    let leaf = m.derive(label::LEAF, &[]);
    let f = intact_core::scheme::FileState {
        subject: intact_core::Subject::Inode(2),
        id: FILE,
        names: ObjectNames::of(&FILE),
        keys: std::sync::Arc::new(FileKeys::new(Arc::new(m.clone()), &FILE)),
        tree: TreeState::empty(&hasher, &FILE),
        ctrs: CounterIntervals::new(),
        ctr_hw: 0,
        rtree: intact_core::scheme::RTreeIndex::for_scheme(scheme),
        inline: None,
        inline_mac: None,
        tags: None,
    };
    (f, hasher, leaf)
}

/// rand-eint: the HKDF keys, the tweak of block 5 at counter 9, and the exact stored bytes
/// of a two-block file (block 0 = text, not random-looking: no leaf; block 1 = the bytes
/// 0..=127, entropy 7 bits > 5.6875: random-looking, one RTree leaf) written at counter 9.
#[test]
fn rand_eint_vectors() {
    use intact_core::scheme::{scheme, Env};
    use intact_core::tree::NodeCache;
    let m = master();
    let (mut f, hasher, leaf) = fixed_file(SchemeId::RandEint);
    let cache = NodeCache::new(0);
    let metrics = intact_core::metrics::Metrics::new();
    let env = Env {
        bs: 128,
        hasher: &hasher,
        leaf_key: &leaf,
        cache: &cache,
        ctr_floor: 9,
        ctr_limit: 1 << 40,
        metrics: &metrics,
        max_object: u64::MAX,
        inline_leaf: false,
        inline_mac: false,
        inline_tree: false,
        twins: false,
    };
    let store = Arc::new(MemStore::new());
    let mut tx = Tx::new(store.clone());
    let mut text =
        b"The trusted state of a file is its record; its blocks live on untrusted storage. "
            .repeat(2);
    text.truncate(128);
    let plain: Vec<u8> = text.iter().copied().chain(0..128u8).collect();
    let mut data = plain.clone();
    let sch = scheme(SchemeId::RandEint);
    sch.write_blocks(&env, &mut f, &mut tx, 0, &mut data)
        .unwrap();
    let mut d = vec![0u8; 256];
    tx.read_at(&f.names.data, 0, &mut d).unwrap();
    let mut node = vec![0u8; 32];
    tx.read_at(&f.names.meta, 0, &mut node).unwrap();
    let mut back = vec![0u8; 256];
    sch.read_blocks(&env, &f, &mut tx, 0, &mut back).unwrap();
    assert_eq!(back, plain);
    assert_eq!(f.tree.leaves, 1);
    assert_eq!(f.blocks(), 2);
    check(&[
        (
            "FILE_WIDE",
            hx(m.derive(label::FILE_WIDE, &FILE).expose_secret()),
            RAND_WIDE_KEY,
        ),
        (
            "FILE_TWEAK",
            hx(m.derive(label::FILE_TWEAK, &FILE).expose_secret()),
            RAND_TWEAK_KEY,
        ),
        ("tweak(5, 9)", hx(f.keys.tweak(5, 9)), RAND_TWEAK_5_9),
        ("rand-eint .d (2 blocks of 128)", hx(&d), RAND_D),
        ("rand-eint .m (leaf of block 1)", hx(&node), RAND_M),
        ("rand-eint root (1 leaf)", hx(f.tree.root), RAND_ROOT),
    ]);
}

const RAND_WIDE_KEY: &str = "ba653333d2932886175b3b4c640e3ad8c8af4227da497da4ac57e59f6e864651";
const RAND_TWEAK_KEY: &str = "3d737a66a53f554fe85ff797365dc8e94a7dec23a1a787a36fd93565d0bfa7be";
const RAND_TWEAK_5_9: &str = "53af41401e19ff86898f0a644983f6ef373a786fe2f1d35c1dec873958f74b26";
const RAND_D: &str =
    "b6284a09795d23ccdf71f1d15498cb2f42f2cff0ebcfff032476304f7e72c9f2bfb2941b382c2dd16b2b38b20a411f7f2f57ad7bf7cd69e05515156fa4bd4b717495eea2d679f924dfce526a5312446409a1e3851f0a7829b62306718a4146f52a54d1cf59b3cc7f8d2dca1cfb631ce9439b762d9f00cfed59ff3c7b4c734aa5e53c0cf4b611cffd6ab2ee9daabe9bc13e80809e7dce7d17a3df5a0e0f85654498f5471d2d41a796634db08a2a6bed61e79c894824b9a9e38a69ae3d92684b13ff68dcdcafc91141c766ab49fb5661d63f867da7aecf81b8e34f347174c9ac4261d8a07f4418384b6cd728f2fd68db4618c84ae3e26b6b318225304cb3d5491d";
const RAND_M: &str = "8a8c88ec4c15c00429f8130ad63f884e1e301dfbbca5cdf46e807c7601000000";
const RAND_ROOT: &str = "81b4c8f3613bc60e89ed4822e4fd8b4abe7c1caece22fc44b02b00c0a830d4e8";

/// comp-eint: a frozen stored block decodes (the compressor's exact output may change with
/// its version, so the frozen direction is decoding): block 0 at counter 9 holding 128
/// bytes of 0x41, as CBC(pad(DEFLATE)) || tag.
#[test]
fn comp_eint_vectors() {
    use intact_core::scheme::{scheme, Env};
    use intact_core::tree::NodeCache;
    for (id, frozen) in [
        (SchemeId::CompEint, COMP_D),
        (SchemeId::CompEintZstd, COMP_ZSTD_D),
    ] {
        let (mut f, hasher, leaf) = fixed_file(id);
        let cache = NodeCache::new(0);
        let metrics = intact_core::metrics::Metrics::new();
        let env = Env {
            bs: 128,
            hasher: &hasher,
            leaf_key: &leaf,
            cache: &cache,
            ctr_floor: 9,
            ctr_limit: 1 << 40,
            metrics: &metrics,
            max_object: u64::MAX,
            inline_leaf: false,
            inline_mac: false,
            inline_tree: false,
            twins: false,
        };
        let store = Arc::new(MemStore::new());
        let mut tx = Tx::new(store.clone());
        let sch = scheme(id);
        let mut data = vec![0x41u8; 128];
        sch.write_blocks(&env, &mut f, &mut tx, 0, &mut data)
            .unwrap();
        let mut d = vec![0u8; 128];
        tx.read_at(&f.names.data, 0, &mut d).unwrap();
        assert_ne!(d, vec![0x41u8; 128]);
        // Decode the frozen bytes (not what this build's compressor wrote).
        let frozen = hex::decode(frozen).unwrap();
        tx.write_at(&f.names.data, 0, &frozen).unwrap();
        let mut back = vec![0u8; 128];
        sch.read_blocks(&env, &f, &mut tx, 0, &mut back).unwrap();
        assert_eq!(back, vec![0x41u8; 128], "{id:?}");
        assert_eq!(f.tree.leaves, 0);
        // The layout: tag = keyed BLAKE3(LEAF, "ctag" || id || i || ctr || first 96 bytes).
        let tag = leaf.mac(&[
            b"ctag",
            &FILE,
            &0u64.to_le_bytes(),
            &9u64.to_le_bytes(),
            &frozen[..96],
        ]);
        assert_eq!(&frozen[96..], &tag);
    }
}

const COMP_D: &str =
    "2f50fe7073ea1cfe490ae1df7ccea1f07b310d257dd95bac3b104811327b67a3ed38ea27ce28024e79158cc036a2bb62181e3bd023a34e1b5ef3920a05fb7ea98f02017df0d259e8354569f3693f60e143c2a956f1338752d37f7e4e6a49fdeb450adc045a5c02535e059b709265ab2496ab38da9ca9d44becd8546b4dba100e";
const COMP_ZSTD_D: &str =
    "a933bccc04afdffbaf16c054c9fdc47ce66c23bed8a6beae6d1c676015ffbe5e9656a94bcf6de0e1127e4c64dcab22b89da2ed51575f4e2165c222a75c68053de8fed41f4a646d1da010faf3ef514d0b1e76c400624e69bd3c3af4efb754aa3481ad678a6e2a0de9f56fcfd035385073b92296bbbbdac8a3a4c750e7a96f01f5";

/// Kinds 5 to 8 (file-format.md §4), checked byte by byte against the table rather than
/// against bytes the code produced: a character device with device number 0x0103 keeps
/// kind 7 in byte 0 and the number in `link` (bytes 120..128, little-endian), and a
/// directory entry repeats the kind code. A record of an unknown kind does not parse.
#[test]
fn special_kinds_in_records_and_entries() {
    let mut i = Inode::new(
        Kind::CharDev,
        SchemeId::MtEintGcm,
        FILE,
        TreeState {
            leaves: 0,
            root: ZERO_HASH,
        },
        0,
    );
    i.link = 0x0103;
    let b = i.encode();
    assert_eq!(b[0], 7);
    assert_eq!(&b[120..128], &[0x03, 0x01, 0, 0, 0, 0, 0, 0]);
    assert_eq!(Inode::decode(&b).unwrap(), i);
    for (code, kind) in [
        (5, Kind::Fifo),
        (6, Kind::Socket),
        (7, Kind::CharDev),
        (8, Kind::BlockDev),
    ] {
        let mut r = b;
        r[0] = code;
        assert_eq!(Inode::decode(&r).unwrap().kind, kind);
        assert_eq!(Kind::of_entry(code), Some(kind));
    }
    let mut r = b;
    r[0] = 9;
    assert!(Inode::decode(&r).is_none());
    assert_eq!(Kind::of_entry(0), None);
    assert_eq!(Kind::of_entry(4), None, "no entry names an attribute file");
    assert_eq!(Kind::of_entry(9), None);
}

// ---------------------------------------------------------------------------------------
// Counters in segments (§9.2)

/// A file of 4,100 blocks, counter 1 but block 4,095 (2): segment 0 holds blocks
/// 0..4,096 (intervals [0, 4095], counters [1, 2]), segment 1 the last four (one interval,
/// counter 1). Their encodings at 0 and `SEG_STRIDE` of `.c`, their hashes (keyed BLAKE3,
/// COUNTERS key, over "cseg" || file id || segment number u64 LE || encoding), the group's
/// ("cgrp" || file id || group number u64 LE || the segments' hashes) and the top
/// ("ctop" || file id || the groups' hashes), and the record's counter bytes (tag 2).
#[test]
fn segmented_counters() {
    let m = master();
    let ctr_key = m.derive(label::COUNTERS, &[]);
    let h = |parts: &[&[u8]]| {
        let mut all: Vec<&[u8]> = vec![parts[0], &FILE];
        all.extend_from_slice(&parts[1..]);
        ctr_key.mac(&all)
    };
    let mut c = CounterIntervals::new();
    c.set_range(0, 4100, 1);
    c.set_range(4095, 1, 2);
    assert_eq!(
        (c.segments(), SEG_BLOCKS, SEG_STRIDE, SEG_GROUP),
        (2, 4096, 69_632, 256)
    );
    let (e0, e1) = (c.segment(0).encode(), c.segment(1).encode());
    let mut hashes = SegHashes::default();
    hashes.set(0, &e0, &h);
    hashes.set(1, &e1, &h);
    let top = hashes.top(&h);
    // The same by hand, from the definitions.
    let s0 = ctr_key.mac(&[b"cseg", &FILE, &0u64.to_le_bytes(), &e0]);
    let s1 = ctr_key.mac(&[b"cseg", &FILE, &1u64.to_le_bytes(), &e1]);
    let g0 = ctr_key.mac(&[b"cgrp", &FILE, &0u64.to_le_bytes(), &s0, &s1]);
    assert_eq!(top, ctr_key.mac(&[b"ctop", &FILE, &g0]));
    let t = TrustedCounters::Segmented {
        intervals: c.intervals() as u32,
        blocks: c.blocks(),
        h_top: top,
    };
    let mut rec = [0u8; 77];
    t.encode_into(&mut rec).unwrap();
    assert_eq!(TrustedCounters::decode(&rec).unwrap(), t);
    check(&[
        ("segment 0", hx(&e0), SEG0),
        ("segment 1", hx(&e1), SEG1),
        ("segment 0 hash", hx(s0), SEG0_HASH),
        ("group 0 hash", hx(g0), GRP0_HASH),
        ("record counters (tag 2)", hx(&rec[..45]), SEG_RECORD),
    ]);
}

const SEG0: &str =
    "0200000000100000000000000000000000000000ff0f00000000000001000000000000000200000000000000";
const SEG1: &str = "01000000040000000000000000000000000000000100000000000000";
const SEG0_HASH: &str = "c0822bfdb49731d74fff3af18aeb08b031cdaea9be8a524620d39b874d2ff50f";
const GRP0_HASH: &str = "14b9bab99bf3d91df2bf3fd10d93da77d740d5da3cf718f5b909a49fe0827f2e";
const SEG_RECORD: &str =
    "02030000000410000000000000746c10c9bb36a2cf1ecf6f286d96aad2a2d4eae86fff33b363f48db1628c7fee";
