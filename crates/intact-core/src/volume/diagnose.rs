//! Explaining an alarm about the whole volume: when the cipher directory and the trusted
//! anchor disagree, what each holds, which one is newer, the likely causes, and the next
//! commands (docs/design.md, "When the store and the anchor disagree").
//!
//! The store keeps a copy of every anchor it was sealed with (`anchor.copy`, untrusted).
//! Authentic under the volume's key, it says which state the store's objects belong to,
//! though not whether that state is the latest: so it can explain a failure, never excuse
//! one. The times shown are the files' modification times, hints only.

use super::*;
#[cfg(test)]
use std::time::Duration;
use std::time::{SystemTime, UNIX_EPOCH};

/// A seal, as one side records it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Seal {
    /// The anchor's epoch (authenticated).
    pub epoch: u64,
    /// When it was stored, in seconds since 1970, from its file's time (not authenticated).
    pub stored_unix: Option<u64>,
}

/// What the cipher directory holds of the anchor: its copy.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum StoreCopy {
    /// No `anchor.copy`.
    Missing,
    /// Present, but not an anchor of this volume under its key (damaged or forged).
    NotAuthentic {
        /// Why.
        why: String,
    },
    /// An authentic anchor.
    Authentic {
        /// Its seal.
        seal: Seal,
    },
}

/// How the store's state relates to the anchor's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The store's copy names the anchor's state (the epochs may differ by sessions that
    /// only opened the volume): a failure is in objects, not in the whole state.
    Same,
    /// The store holds a state older than the anchor's.
    StoreOlder,
    /// The store holds a state newer than the anchor's.
    StoreNewer,
    /// The same epoch and another state: two writers went on from one seal.
    Diverged,
    /// The store's copy is missing or not authentic: the state cannot be dated.
    Unknown,
    /// There is no trusted anchor.
    NoAnchor,
}

/// What the anchor and the store say of the volume's state.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StateReport {
    /// The volume id (hex).
    pub volume_id: String,
    /// Where the trusted anchor lives.
    pub anchor_location: String,
    /// The trusted anchor's seal (`None`: missing).
    pub anchor: Option<Seal>,
    /// The store's copy.
    pub store: StoreCopy,
    /// Files of the cipher directory that a sync tool left as conflict copies of ours.
    pub conflicts: Vec<String>,
    /// How they relate.
    pub verdict: Verdict,
}

/// `secs` since 1970 as a UTC date and time, `2026-11-26 02:45:39 UTC` (H. Hinnant's
/// days-to-civil algorithm; one call does not warrant a date crate).
pub fn utc(secs: u64) -> String {
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

fn unix(t: Option<SystemTime>) -> Option<u64> {
    t.and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_secs())
}

/// Whether two anchors name the same state of the store: the same checkpoint (journal,
/// inode table) and log. The epoch and the counter reservation are not compared: every
/// read-write open advances them, with nothing else. (The copy also lags the anchor when a
/// session started a log segment and crashed before its first seal: then the volume opens
/// and nothing is reported but by `intact info`, which says so.)
fn same_state(a: &Anchor, b: &Anchor) -> bool {
    a.journal == b.journal && a.applied == b.applied && a.log == b.log && a.itable == b.itable
}

/// Whether `name`, in a cipher directory, is a sync tool's conflict copy: intact never
/// names an object with a space or the word "conflict" (Dropbox: `x (conflicted copy
/// …)`, Nextcloud and ownCloud: `x (conflicted copy …)`, Syncthing: `x.sync-conflict-…`,
/// Google Drive and others: `x (1)`, Windows: `x - Copy`).
pub fn is_conflict_copy(name: &str) -> bool {
    let base = name.rsplit('/').next().unwrap_or(name);
    let lower = base.to_ascii_lowercase();
    lower.contains("conflict")
        || lower.contains(" - copy")
        || base.split(" (").skip(1).any(|rest| {
            rest.split(')')
                .next()
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
}

/// The cipher directory's copy of the anchor, its bytes and what they say, when it is an
/// authentic anchor of this volume; else what it is instead.
fn read_copy(
    store: &dyn UntrustedStore,
    config: &Config,
    keys: &Keys,
) -> std::result::Result<(Vec<u8>, Anchor), StoreCopy> {
    match store.read_all(ANCHOR_COPY_NAME) {
        Ok(None) => Err(StoreCopy::Missing),
        Err(e) => Err(StoreCopy::NotAuthentic {
            why: format!("unreadable: {e}"),
        }),
        Ok(Some(b)) => match Anchor::decode(&b, &keys.anchor) {
            Ok(a) if a.volume_id == config.volume_id_bytes() => Ok((b, a)),
            Ok(_) => Err(StoreCopy::NotAuthentic {
                why: "it names another volume".into(),
            }),
            Err(e) => Err(StoreCopy::NotAuthentic { why: e.to_string() }),
        },
    }
}

impl StateReport {
    /// Reads both sides. `anchor` is the trusted anchor's bytes (if any) and when it was
    /// stored.
    pub(super) fn read(
        store: &dyn UntrustedStore,
        config: &Config,
        keys: &Keys,
        location: String,
        anchor: Option<(Vec<u8>, Option<SystemTime>)>,
    ) -> StateReport {
        let trusted = anchor.as_ref().and_then(|(b, t)| {
            Anchor::decode(b, &keys.anchor)
                .ok()
                .filter(|a| a.volume_id == config.volume_id_bytes())
                .map(|a| (a, *t))
        });
        let copy = read_copy(store, config, keys).map(|(_, a)| a);
        let copy_time = unix(store.modified(ANCHOR_COPY_NAME));
        let verdict = match (&trusted, &copy) {
            (None, _) => Verdict::NoAnchor,
            (Some(_), Err(_)) => Verdict::Unknown,
            (Some((a, _)), Ok(c)) if same_state(a, c) => Verdict::Same,
            (Some((a, _)), Ok(c)) => match c.epoch.cmp(&a.epoch) {
                std::cmp::Ordering::Less => Verdict::StoreOlder,
                std::cmp::Ordering::Greater => Verdict::StoreNewer,
                std::cmp::Ordering::Equal => Verdict::Diverged,
            },
        };
        let mut conflicts: Vec<String> = store
            .list()
            .unwrap_or_default()
            .into_iter()
            .filter(|n| is_conflict_copy(n))
            .collect();
        conflicts.sort();
        StateReport {
            volume_id: config.volume_id.clone(),
            anchor_location: location,
            anchor: trusted.map(|(a, t)| Seal {
                epoch: a.epoch,
                stored_unix: unix(t),
            }),
            store: match copy {
                Ok(c) => StoreCopy::Authentic {
                    seal: Seal {
                        epoch: c.epoch,
                        stored_unix: copy_time,
                    },
                },
                Err(s) => s,
            },
            conflicts,
            verdict,
        }
    }

    /// The store's state as its copy of the anchor says, for a look that does not trust
    /// it (`--accept-stale`): the copy's bytes when they are authentic.
    pub(super) fn copy_bytes(store: &dyn UntrustedStore) -> Result<Vec<u8>> {
        store.read_all(ANCHOR_COPY_NAME)?.ok_or_else(|| {
            Error::Config(format!(
                "{ANCHOR_COPY_NAME} is missing from the cipher directory: it holds no state to look at"
            ))
        })
    }

    /// What happened, in plain words, and the next commands.
    pub fn explain(&self) -> String {
        let when = |s: &Seal| match s.stored_unix {
            Some(t) => format!("epoch {} (stored {})", s.epoch, utc(t)),
            None => format!("epoch {}", s.epoch),
        };
        let anchor = self.anchor.as_ref().map(when).unwrap_or_default();
        let store = match &self.store {
            StoreCopy::Authentic { seal } => when(seal),
            StoreCopy::Missing => "unknown (its copy of the anchor is missing)".into(),
            StoreCopy::NotAuthentic { why } => {
                format!("unknown (its copy of the anchor is not authentic: {why})")
            }
        };
        let look = "  intact --accept-stale ls /      look at the cipher directory's own state, read-only, without trusting it";
        let accept = "  intact accept-store             accept that state from now on (asks first; keeps the current anchor and records the change)";
        let mut s = match self.verdict {
            Verdict::StoreOlder => format!(
                "The cipher directory holds an OLDER state of this volume than the one last sealed \
                 here: the cipher directory is at {store}, the trusted anchor ({}) at {anchor}.\n\
                 Likely causes: an older copy of the cipher directory was restored or synced back \
                 (a backup restored by hand, a sync client restoring a version); or someone rolled \
                 it back on purpose. What was sealed after the cipher directory's epoch is not in it.\n\
                 What you can do: put back the newest copy of the cipher directory if you have one, \
                 then run the command again; or\n{look}\n{accept}",
                self.anchor_location
            ),
            Verdict::StoreNewer => format!(
                "The cipher directory holds a NEWER state of this volume than the one last sealed \
                 here: the cipher directory is at {store}, the trusted anchor ({}) at {anchor}.\n\
                 Likely causes: another machine (or another --state directory) wrote to the volume \
                 with an anchor of its own; or this state directory was restored from an older \
                 backup; or tampering.\n\
                 What you can do: use the volume where it was last written (that machine, or \
                 --state with its state directory); or\n{look}\n{accept}",
                self.anchor_location
            ),
            Verdict::Diverged => format!(
                "The cipher directory and the trusted anchor ({}) hold two DIFFERENT states of the \
                 same epoch ({anchor}; the cipher directory: {store}): two writers each went on \
                 from the same seal, for example two machines mounting one synced cipher directory, \
                 each with its own state directory; or tampering.\n\
                 What you can do: keep one writer per volume; to look or to go on with the cipher \
                 directory's state:\n{look}\n{accept}",
                self.anchor_location
            ),
            Verdict::Same => format!(
                "The cipher directory is at the state the trusted anchor ({}) names ({anchor}), but \
                 some of its files were damaged or changed since (disk errors, a sync tool, a \
                 program writing into the cipher directory, or tampering).\n\
                 What you can do:\n  intact fsck                     name every damaged file and \
                 block\n  intact fsck --salvage DIR       copy every file out, keeping every block \
                 that still authenticates",
                self.anchor_location
            ),
            Verdict::Unknown => format!(
                "The cipher directory's state cannot be dated: it is {store}; the trusted anchor \
                 ({}) is at {anchor}. The cipher directory was replaced, damaged or tampered with.\n\
                 What you can do: put back a copy of the cipher directory you trust; `intact fsck` \
                 names what fails.",
                self.anchor_location
            ),
            Verdict::NoAnchor => format!(
                "There is no trusted anchor for volume {} at {}; the cipher directory is at \
                 {store}. If the state directory was lost or moved: `intact recover-anchor \
                 --help`.",
                self.volume_id, self.anchor_location
            ),
        };
        if !self.conflicts.is_empty() {
            let shown: Vec<&str> = self.conflicts.iter().take(5).map(String::as_str).collect();
            s.push_str(&format!(
                "\nA sync tool left {} conflict cop{} of intact's own files in the cipher \
                 directory ({}{}): two machines wrote the volume at the same time. intact never \
                 reads them. Keep one writer per volume; once the volume opens, delete them.",
                self.conflicts.len(),
                if self.conflicts.len() == 1 {
                    "y"
                } else {
                    "ies"
                },
                shown.join(", "),
                if self.conflicts.len() > shown.len() {
                    ", …"
                } else {
                    ""
                }
            ));
        }
        s
    }
}

impl Volume {
    /// What the trusted anchor and the cipher directory each say of the volume's state,
    /// without opening it (`intact info`, and the explanation of a failed open).
    pub fn state_report(
        store: &dyn UntrustedStore,
        trusted: &dyn TrustedStore,
        password: &[u8],
    ) -> Result<StateReport> {
        let config = read_config(store)?;
        let master = unwrap_key(&config, password)?;
        let keys = derive_keys(&master);
        let anchor = trusted.load()?.map(|b| (b, trusted.modified()));
        Ok(StateReport::read(
            store,
            &config,
            &keys,
            trusted.location(),
            anchor,
        ))
    }
}

/// The trusted store of a look that does not trust (`--accept-stale`): it answers with the
/// cipher directory's own copy of the anchor, shares the real state directory's lock (so
/// no writer runs meanwhile), and refuses to store anything.
struct StaleAnchor {
    real: Box<dyn TrustedStore>,
    copy: Vec<u8>,
}

impl TrustedStore for StaleAnchor {
    fn load(&self) -> Result<Option<Vec<u8>>> {
        Ok(Some(self.copy.clone()))
    }
    fn store(&self, _bytes: &[u8]) -> Result<()> {
        Err(Error::Invalid(
            "--accept-stale only reads: nothing is written".into(),
        ))
    }
    fn lock(&self, exclusive: bool) -> Result<crate::store::TrustedLock> {
        if exclusive {
            return Err(Error::Invalid(
                "--accept-stale only reads: nothing is written".into(),
            ));
        }
        self.real.lock(false)
    }
    fn location(&self) -> String {
        format!(
            "{ANCHOR_COPY_NAME} of the cipher directory (not trusted; the trusted anchor is at {})",
            self.real.location()
        )
    }
    fn remove(&self) -> Result<()> {
        Err(Error::Invalid(
            "--accept-stale only reads: nothing is written".into(),
        ))
    }
}

/// What `accept-store` did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Accepted {
    /// The report it acted on.
    pub report: StateReport,
    /// The epoch of the anchor it replaced (kept by the caller).
    pub old_epoch: u64,
    /// The epoch of the new anchor.
    pub new_epoch: u64,
    /// The inode table's root hash in the old anchor (hex).
    pub old_root: String,
    /// The same in the new anchor: the store's state.
    pub new_root: String,
}

impl Volume {
    /// Opens the cipher directory's own latest authentic state read-only: authentic under
    /// the key, maybe not fresh (its copy of the anchor stands in for the trusted one,
    /// which is neither used nor changed). For looking at a state that raised an alarm.
    pub fn open_stale(
        store: Arc<dyn UntrustedStore>,
        trusted: Box<dyn TrustedStore>,
        password: &[u8],
        opts: &Options,
    ) -> Result<Volume> {
        let copy = StateReport::copy_bytes(store.as_ref())?;
        let opts = Options {
            read_only: true,
            ..opts.clone()
        };
        let stale = StaleAnchor {
            real: trusted,
            copy,
        };
        Volume::open(store, Box::new(stale), password, &opts)
    }

    /// Re-anchors the volume to the cipher directory's own state (its copy of the anchor),
    /// after checking that this state opens (authentic under the key at the volume level).
    /// `keep` receives the old anchor's bytes (to keep them) before the new anchor is
    /// stored. The new anchor's epoch is past both, and its counter reservation past both,
    /// so no write counter or log segment id of the state given up is ever used again
    /// (nonces stay unique), and going back to an even older copy is detected again.
    /// Refused while the volume is open anywhere (the lock).
    pub fn accept_store(
        store: Arc<dyn UntrustedStore>,
        trusted: &dyn TrustedStore,
        password: &[u8],
        keep: impl FnOnce(&[u8], u64) -> Result<()>,
    ) -> Result<Accepted> {
        let config = read_config(store.as_ref())?;
        let master = unwrap_key(&config, password)?;
        let keys = derive_keys(&master);
        let lock = trusted.lock(true)?;
        let old_bytes = trusted.load()?.ok_or_else(|| {
            Error::Invalid(
                "there is no trusted anchor to replace; to rebuild a lost one, see `intact recover-anchor --help`"
                    .into(),
            )
        })?;
        let old = Anchor::decode(&old_bytes, &keys.anchor)?;
        let report = StateReport::read(
            store.as_ref(),
            &config,
            &keys,
            trusted.location(),
            Some((old_bytes.clone(), trusted.modified())),
        );
        let (copy_bytes, copy) = read_copy(store.as_ref(), &config, &keys).map_err(|c| {
            let what = match c {
                StoreCopy::Missing => "is missing".to_string(),
                StoreCopy::NotAuthentic { why } => format!("is not authentic ({why})"),
                StoreCopy::Authentic { .. } => unreachable!("an error"),
            };
            Error::Config(format!(
                "the cipher directory's {ANCHOR_COPY_NAME} {what}: there is no state of its own to accept"
            ))
        })?;
        // The state must open before it is accepted. The check opens it read-only with the
        // copy in an in-memory trusted store; the state directory's lock is let go
        // meanwhile, taken again after, and the anchor checked unchanged.
        drop(lock);
        {
            let check = crate::store::MemTrusted::default();
            check.store(&copy_bytes)?;
            let opts = Options {
                read_only: true,
                cache_bytes: 1 << 20,
                ..Options::default()
            };
            let v = Volume::open(store.clone(), Box::new(check), password, &opts)
                .map_err(|e| match e {
                    Error::StateMismatch { cause, .. } => *cause,
                    e => e,
                })
                .map_err(|e| {
                    Error::Config(format!(
                        "the cipher directory's own state does not open either, so it is not accepted: {e}"
                    ))
                })?;
            drop(v);
        }
        let _lock = trusted.lock(true)?;
        if trusted.load()?.as_deref() != Some(&old_bytes[..]) {
            return Err(Error::Invalid(
                "the trusted anchor changed meanwhile (the volume was opened for writing): run the command again".into(),
            ));
        }
        let mut new = copy.clone();
        new.epoch = old.epoch.max(copy.epoch) + 1;
        new.ctr_next = old.ctr_next.max(copy.ctr_next);
        keep(&old_bytes, old.epoch)?;
        trusted.store(&new.encode(&keys.anchor))?;
        Ok(Accepted {
            report,
            old_epoch: old.epoch,
            new_epoch: new.epoch,
            old_root: hex::encode(old.itable.tree.root),
            new_root: hex::encode(new.itable.tree.root),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::KdfParams;
    use crate::store::{MemStore, MemTrusted};
    use std::collections::BTreeMap;

    const PW: &[u8] = b"diagnose";

    /// A volume on a memory store with a file `/f` of `content`, sealed.
    fn volume(content: &[u8]) -> (Arc<MemStore>, MemTrusted) {
        let store = Arc::new(MemStore::new());
        let trusted = MemTrusted::default();
        let t = trusted.clone();
        let v = Volume::create(
            store.clone(),
            move |_| Ok(Box::new(t) as Box<dyn TrustedStore>),
            PW,
            &crate::CreateOptions {
                block_size: 4096,
                scheme: SchemeId::MtEintGcm,
                auto: false,
                kdf: KdfParams::TEST,
                inline_leaf: true,
                dir_tree: true,
                inline_mac: true,
                inline_tree: true,
                inline_data: true,
                ctr_segments: true,
                twin_blocks: true,
                leaf_log: true,
                log_delta: true,
            },
            &Options::default(),
        )
        .unwrap();
        v.create_file("/f", None).unwrap();
        v.write_path("/f", 0, content).unwrap();
        v.sync().unwrap();
        (store, trusted)
    }

    fn open(store: &Arc<MemStore>, trusted: &MemTrusted) -> Result<Volume> {
        Volume::open(
            store.clone(),
            Box::new(trusted.clone()),
            PW,
            &Options::default(),
        )
    }

    /// Rewrites `/f` and seals.
    fn rewrite(store: &Arc<MemStore>, trusted: &MemTrusted, content: &[u8]) {
        let v = open(store, trusted).unwrap();
        v.truncate("/f", 0).unwrap();
        v.write_path("/f", 0, content).unwrap();
        v.sync().unwrap();
    }

    fn read(v: &Volume) -> Vec<u8> {
        let mut b = vec![0u8; 64];
        let n = v.read_path("/f", 0, &mut b).unwrap();
        b.truncate(n);
        b
    }

    fn report(store: &Arc<MemStore>, trusted: &MemTrusted) -> StateReport {
        Volume::state_report(store.as_ref(), trusted, PW).unwrap()
    }

    fn anchor(store: &Arc<MemStore>, bytes: &[u8]) -> Anchor {
        let config = read_config(store.as_ref()).unwrap();
        let keys = derive_keys(&unwrap_key(&config, PW).unwrap());
        Anchor::decode(bytes, &keys.anchor).unwrap()
    }

    /// The report of an open that failed for the whole volume.
    fn mismatch(store: &Arc<MemStore>, trusted: &MemTrusted) -> StateReport {
        match open(store, trusted) {
            Err(Error::StateMismatch { cause, report }) => {
                assert!(cause.is_tampered(), "{cause}");
                *report
            }
            Err(e) => panic!("another failure: {e}"),
            Ok(_) => panic!("the volume opened"),
        }
    }

    type Snap = (BTreeMap<String, Vec<u8>>, Option<Vec<u8>>);

    fn snap(store: &Arc<MemStore>, trusted: &MemTrusted) -> Snap {
        (store.snapshot(), trusted.snapshot())
    }

    #[test]
    fn older_newer_diverged_same_and_undated_states_are_told_apart() {
        let (store, trusted) = volume(b"one");
        let r = report(&store, &trusted);
        assert_eq!(r.verdict, Verdict::Same);
        assert!(r.conflicts.is_empty());
        let (s1, a1) = snap(&store, &trusted);
        rewrite(&store, &trusted, b"two");
        let (s2, a2) = snap(&store, &trusted);
        let e1 = anchor(&store, a1.as_ref().unwrap()).epoch;
        let e2 = anchor(&store, a2.as_ref().unwrap()).epoch;
        assert!(e1 < e2);

        // The store goes back.
        store.restore(s1.clone());
        let r = mismatch(&store, &trusted);
        assert_eq!(r.verdict, Verdict::StoreOlder);
        assert_eq!(r.anchor.as_ref().map(|s| s.epoch), Some(e2));
        match &r.store {
            StoreCopy::Authentic { seal } => assert_eq!(seal.epoch, e1),
            other => panic!("{other:?}"),
        }
        assert!(r.explain().contains("OLDER state"), "{}", r.explain());
        // info's report says the same (a read-write open that failed still reserved its
        // counters: the anchor's epoch is one further).
        let again = report(&store, &trusted);
        assert_eq!((again.verdict, &again.store), (r.verdict, &r.store));
        assert_eq!(again.anchor.map(|s| s.epoch), Some(e2 + 1));

        // The anchor goes back (or another machine wrote on).
        store.restore(s2.clone());
        trusted.restore(a1.clone());
        let r = mismatch(&store, &trusted);
        assert_eq!(r.verdict, Verdict::StoreNewer);
        assert!(r.explain().contains("NEWER state"), "{}", r.explain());

        // Two writers from one seal: the same epoch, another state.
        store.restore(s1.clone());
        trusted.restore(a1.clone());
        rewrite(&store, &trusted, b"mine");
        let (s3, _) = snap(&store, &trusted);
        store.restore(s1.clone());
        trusted.restore(a1.clone());
        rewrite(&store, &trusted, b"theirs");
        store.restore(s3);
        let r = mismatch(&store, &trusted);
        assert_eq!(r.verdict, Verdict::Diverged, "{r:?}");
        assert!(r.explain().contains("DIFFERENT states"), "{}", r.explain());

        // Damaged objects under the anchor's state.
        store.restore(s2.clone());
        trusted.restore(a2.clone());
        let itable = store
            .snapshot()
            .into_keys()
            .filter(|n| n.ends_with(".d"))
            .collect::<Vec<_>>();
        for n in &itable {
            store.with_object(n, |o| o[0] ^= 1);
        }
        let r = mismatch(&store, &trusted);
        assert_eq!(r.verdict, Verdict::Same);
        assert!(
            r.explain().contains("damaged or changed"),
            "{}",
            r.explain()
        );

        // The copy gone, or not authentic: undated.
        store.restore(s1.clone());
        store.delete(ANCHOR_COPY_NAME).unwrap();
        let r = mismatch(&store, &trusted);
        assert_eq!(
            (r.verdict, r.store.clone()),
            (Verdict::Unknown, StoreCopy::Missing)
        );
        assert!(r.explain().contains("cannot be dated"), "{}", r.explain());
        store.restore(s1.clone());
        store.with_object(ANCHOR_COPY_NAME, |o| o[30] ^= 1);
        let r = mismatch(&store, &trusted);
        assert_eq!(r.verdict, Verdict::Unknown);
        assert!(matches!(r.store, StoreCopy::NotAuthentic { .. }), "{r:?}");

        // No anchor at all.
        store.restore(s2);
        trusted.restore(None);
        let r = report(&store, &trusted);
        assert_eq!((r.verdict, r.anchor.clone()), (Verdict::NoAnchor, None));
        assert!(r.explain().contains("recover-anchor"), "{}", r.explain());
    }

    #[test]
    fn a_store_behind_by_log_seals_alone_is_older() {
        // Seals of the log (fsync) change the anchor's log reference and nothing else.
        let (store, trusted) = volume(b"one");
        let v = open(&store, &trusted).unwrap();
        let ino = v.stat("/f").unwrap().ino;
        v.write_path("/f", 0, b"two").unwrap();
        v.fsync(ino).unwrap();
        let (s1, a1) = snap(&store, &trusted);
        v.write_path("/f", 0, b"six").unwrap();
        v.fsync(ino).unwrap();
        v.set_seal_on_drop(false);
        drop(v);
        let (_, a2) = snap(&store, &trusted);
        let (x, y) = (anchor(&store, &a1.unwrap()), anchor(&store, &a2.unwrap()));
        assert_eq!((&x.journal, &x.itable), (&y.journal, &y.itable));
        assert_ne!(x.log, y.log);
        store.restore(s1);
        let r = mismatch(&store, &trusted);
        assert_eq!(r.verdict, Verdict::StoreOlder, "{r:?}");
    }

    #[test]
    fn a_stale_anchor_stores_nothing_and_says_what_it_is() {
        let real = MemTrusted::default();
        real.store(b"trusted").unwrap();
        let stale = StaleAnchor {
            real: Box::new(real.clone()),
            copy: b"copy".to_vec(),
        };
        assert_eq!(stale.load().unwrap().as_deref(), Some(&b"copy"[..]));
        assert!(stale.store(b"x").is_err());
        assert!(stale.remove().is_err());
        assert!(stale.lock(true).is_err());
        let shared = stale.lock(false).unwrap();
        assert!(!shared.is_exclusive());
        // The real lock is held: no writer meanwhile.
        assert!(matches!(real.lock(true), Err(Error::Locked(_))));
        drop(shared);
        let loc = stale.location();
        assert!(
            loc.contains(ANCHOR_COPY_NAME) && loc.contains(&real.location()),
            "{loc}"
        );
        assert_eq!(real.load().unwrap().as_deref(), Some(&b"trusted"[..]));
    }

    #[test]
    fn a_copy_naming_another_volume_is_not_authentic() {
        let (store, trusted) = volume(b"one");
        let config = read_config(store.as_ref()).unwrap();
        let keys = derive_keys(&unwrap_key(&config, PW).unwrap());
        let mut copy = anchor(&store, &store.snapshot()[ANCHOR_COPY_NAME]);
        copy.volume_id[0] ^= 1;
        store
            .write_at(ANCHOR_COPY_NAME, 0, &copy.encode(&keys.anchor))
            .unwrap();
        let r = report(&store, &trusted);
        assert_eq!(r.verdict, Verdict::Unknown);
        assert_eq!(
            r.store,
            StoreCopy::NotAuthentic {
                why: "it names another volume".into()
            }
        );
    }

    #[test]
    fn conflict_copies_are_listed_and_explained() {
        let (store, trusted) = volume(b"one");
        store
            .write_at("journal.1 (conflicted copy)", 0, b"x")
            .unwrap();
        let r = report(&store, &trusted);
        assert_eq!(r.conflicts, ["journal.1 (conflicted copy)"]);
        assert!(
            r.explain().contains("1 conflict copy of"),
            "{}",
            r.explain()
        );
        store.write_at("f/aa/x (1)", 0, b"x").unwrap();
        let r = report(&store, &trusted);
        assert_eq!(r.conflicts.len(), 2);
        assert!(r.explain().contains("2 conflict copies"), "{}", r.explain());
    }

    #[test]
    fn open_stale_reads_the_stores_own_state_and_changes_nothing() {
        let (store, trusted) = volume(b"one");
        let (s1, _) = snap(&store, &trusted);
        rewrite(&store, &trusted, b"two");
        store.restore(s1);
        let before = snap(&store, &trusted);
        let ro = Options {
            read_only: true,
            ..Options::default()
        };
        let v = Volume::open_stale(store.clone(), Box::new(trusted.clone()), PW, &ro).unwrap();
        assert_eq!(read(&v), b"one");
        assert!(v.write_path("/f", 0, b"x").is_err());
        // Read-only even when asked otherwise.
        let v2 = Volume::open_stale(
            store.clone(),
            Box::new(trusted.clone()),
            PW,
            &Options::default(),
        )
        .unwrap();
        assert!(v2.write_path("/f", 0, b"x").is_err());
        drop((v, v2));
        assert!(
            snap(&store, &trusted) == before,
            "a stale look changed something"
        );
        // No copy, nothing to look at.
        store.delete(ANCHOR_COPY_NAME).unwrap();
        assert!(Volume::open_stale(store.clone(), Box::new(trusted), PW, &ro).is_err());
    }

    #[test]
    fn accept_store_reanchors_past_both_sides_and_a_later_rollback_is_caught() {
        let (store, trusted) = volume(b"zero");
        let (s0, _) = snap(&store, &trusted);
        rewrite(&store, &trusted, b"one");
        let (s1, _) = snap(&store, &trusted);
        rewrite(&store, &trusted, b"two");
        let (_, a2) = snap(&store, &trusted);
        let old = anchor(&store, a2.as_ref().unwrap());
        let copy1 = anchor(&store, &s1[ANCHOR_COPY_NAME]);
        store.restore(s1.clone());
        let stored = store.snapshot();
        // Refused while the volume is open (here by a stale reader).
        let ro = Options {
            read_only: true,
            ..Options::default()
        };
        let holder = Volume::open_stale(store.clone(), Box::new(trusted.clone()), PW, &ro).unwrap();
        assert!(matches!(
            Volume::accept_store(store.clone(), &trusted, PW, |_, _| Ok(())),
            Err(Error::Locked(_))
        ));
        drop(holder);
        let mut kept = None;
        let done = Volume::accept_store(store.clone(), &trusted, PW, |b, e| {
            kept = Some((b.to_vec(), e));
            Ok(())
        })
        .unwrap();
        assert_eq!(kept, Some((a2.clone().unwrap(), old.epoch)));
        assert!(
            store.snapshot() == stored,
            "accepting wrote into the cipher directory"
        );
        assert_eq!(done.report.verdict, Verdict::StoreOlder);
        assert_eq!(done.old_epoch, old.epoch);
        let new = anchor(&store, &trusted.snapshot().unwrap());
        assert_eq!(new.epoch, old.epoch.max(copy1.epoch) + 1);
        assert_eq!(done.new_epoch, new.epoch);
        assert_eq!(new.ctr_next, old.ctr_next.max(copy1.ctr_next));
        assert!(
            new.ctr_next > copy1.ctr_next,
            "counters of the state given up stay used"
        );
        assert_eq!(new.itable, copy1.itable);
        assert_eq!(done.new_root, hex::encode(copy1.itable.tree.root));
        assert_eq!(done.old_root, hex::encode(old.itable.tree.root));
        // Then it works, and writes.
        let v = open(&store, &trusted).unwrap();
        assert_eq!(read(&v), b"one");
        drop(v);
        rewrite(&store, &trusted, b"three");
        // Going back further is an alarm again; so is the state just accepted.
        store.restore(s0);
        assert_eq!(mismatch(&store, &trusted).verdict, Verdict::StoreOlder);
        store.restore(s1.clone());
        assert_eq!(mismatch(&store, &trusted).verdict, Verdict::StoreOlder);
    }

    #[test]
    fn accept_store_refuses_what_cannot_be_accepted() {
        let (store, trusted) = volume(b"one");
        let (s1, _) = snap(&store, &trusted);
        rewrite(&store, &trusted, b"two");
        let a2 = trusted.snapshot();
        let ok = |_: &[u8], _: u64| Ok(());
        // The copy damaged: no state of its own.
        store.restore(s1.clone());
        store.with_object(ANCHOR_COPY_NAME, |o| o[30] ^= 1);
        let e = Volume::accept_store(store.clone(), &trusted, PW, ok).unwrap_err();
        assert!(e.to_string().contains("not authentic"), "{e}");
        // The copy's state does not open: its inode table damaged.
        store.restore(s1.clone());
        for n in store.snapshot().into_keys().filter(|n| n.ends_with(".d")) {
            store.with_object(&n, |o| o[0] ^= 1);
        }
        let e = Volume::accept_store(store.clone(), &trusted, PW, ok).unwrap_err();
        assert!(e.to_string().contains("does not open either"), "{e}");
        assert_eq!(trusted.snapshot(), a2, "nothing changed");
        // A failure to keep the old anchor stops it before the new one is stored.
        store.restore(s1);
        let e = Volume::accept_store(store.clone(), &trusted, PW, |_, _| {
            Err(Error::Invalid("disk full".into()))
        })
        .unwrap_err();
        assert!(e.to_string().contains("disk full"), "{e}");
        assert_eq!(trusted.snapshot(), a2, "nothing changed");
        // No anchor: nothing to replace.
        trusted.restore(None);
        let e = Volume::accept_store(store.clone(), &trusted, PW, ok).unwrap_err();
        assert!(e.to_string().contains("recover-anchor"), "{e}");
    }

    #[test]
    fn dates_are_utc_civil_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_795_660_667), "2026-11-26 02:37:47 UTC");
        assert_eq!(utc(4_107_542_399), "2100-02-28 23:59:59 UTC");
        // The first day of a century's year in the 400-year cycle (not a leap year).
        assert_eq!(utc(4_107_542_400), "2100-03-01 00:00:00 UTC");
        assert_eq!(utc(13_574_563_200), "2400-02-29 00:00:00 UTC");
    }

    #[test]
    fn file_times_become_seconds_since_1970() {
        assert_eq!(unix(None), None);
        assert_eq!(
            unix(Some(UNIX_EPOCH + Duration::from_millis(5_999))),
            Some(5)
        );
        assert_eq!(
            unix(Some(UNIX_EPOCH + Duration::from_secs(1_795_660_667))),
            Some(1_795_660_667)
        );
        assert_eq!(unix(UNIX_EPOCH.checked_sub(Duration::from_secs(1))), None);
    }

    #[test]
    fn conflict_copies_of_sync_tools_are_recognized() {
        for n in [
            "journal.1 (conflicted copy 2026-11-25)",
            "f/ab/abcd.m (Case Conflict)",
            "log.0000000100000002.sync-conflict-20261125-101010-ABCDEFG",
            "anchor (1).copy",
            "intact.conf (2)",
            "journal - Copy.0",
        ] {
            assert!(is_conflict_copy(n), "{n}");
        }
        for n in [
            "journal.1",
            "anchor.copy",
            "log.0000000100000002",
            "f/ab/abcdef0123456789abcdef0123456789.d",
            "intact.conf",
            "x (y)",
        ] {
            assert!(!is_conflict_copy(n), "{n}");
        }
    }
}
