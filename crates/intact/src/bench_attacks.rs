//! `intact bench attacks`: the twelve tampering and rollback attacks of
//! docs/threat-model.md against scratch volumes, one set per scheme, and against the
//! encrypted file systems installed beside intact (gocryptfs, CryFS, securefs), so a user
//! can check our security claims, and the peers', on their own machine.
//!
//! intact's volumes are attacked at library level in the local directory store (the
//! attacks are `intact_core::attacks`, which `tests/attacks.rs` also runs); the peers
//! through their own mounts ([`crate::attack_peers`]).

use crate::attack_peers::{self, PeerRun};
use crate::bench::{log, steps, TempDir, PW};
use anyhow::{bail, Context, Result};
use clap::Args;
use intact_core::attacks::{self, Bed, Content, Verdict};
use intact_core::crypto::KdfParams;
use intact_core::format::SchemeId;
use intact_core::store::{LocalDirStore, LocalStateDir, TrustedStore, UntrustedStore};
use intact_core::{CreateOptions, Options, Volume};
use serde::Serialize;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Arguments of `intact bench attacks`.
#[derive(Debug, Args)]
pub struct AttacksArgs {
    /// Comma-separated schemes to attack [default: all eight].
    #[arg(long, value_delimiter = ',')]
    schemes: Vec<String>,
    /// Contents of the attacked files: pattern, text, noise, mixed [default: for each
    /// scheme, the contents that take each of its paths (rand-eint: pattern, text, mixed;
    /// comp-eint: text, noise; comp-eint-zstd: pattern, mixed; others: pattern)].
    #[arg(long, value_delimiter = ',')]
    content: Vec<String>,
    /// Comma-separated peers to attack too: gocryptfs, cryfs, securefs, or `none`
    /// [default: each one installed].
    #[arg(long, value_delimiter = ',')]
    peers: Vec<String>,
    /// Where the scratch volumes go.
    #[arg(long, default_value = "/var/tmp")]
    workdir: PathBuf,
}

impl AttacksArgs {
    /// What `bench report` runs: every scheme on its default contents, and the peers
    /// installed; the quick run leaves out CryFS, whose 25 or so mounts each derive a key
    /// with scrypt at its default cost (about 7 s here).
    pub(crate) fn for_report(quick: bool, workdir: PathBuf) -> AttacksArgs {
        let peers = match quick {
            true => {
                let mut p: Vec<String> = vec!["none".into()];
                p.extend(
                    attack_peers::chosen(&[])
                        .unwrap_or_default()
                        .into_iter()
                        .filter(|k| *k != attack_peers::PeerKind::Cryfs)
                        .map(|k| k.name().to_string()),
                );
                p
            }
            false => vec![],
        };
        AttacksArgs {
            schemes: vec![],
            content: vec![],
            peers,
            workdir,
        }
    }
}

/// A scratch intact volume in a local directory, its anchor in a state directory beside.
struct LocalBed {
    _dir: TempDir,
    store: Arc<dyn UntrustedStore>,
    state: PathBuf,
}

impl LocalBed {
    fn new(workdir: &Path) -> Result<LocalBed> {
        let dir = TempDir::new(workdir, "attack")?;
        let cipher = dir.0.join("cipher");
        let state = dir.0.join("state");
        std::fs::create_dir_all(&cipher)?;
        Ok(LocalBed {
            store: Arc::new(LocalDirStore::open(&cipher)?),
            _dir: dir,
            state,
        })
    }

    fn opts() -> Options {
        Options::default()
    }
}

impl Bed for LocalBed {
    fn store(&self) -> Arc<dyn UntrustedStore> {
        self.store.clone()
    }
    fn create(&self, copts: &CreateOptions) -> intact_core::Result<Volume> {
        let state = self.state.clone();
        Volume::create(
            self.store.clone(),
            |id| Ok(Box::new(LocalStateDir::new(state, id)?) as Box<dyn TrustedStore>),
            PW,
            copts,
            &Self::opts(),
        )
    }
    fn open(&self) -> intact_core::Result<Volume> {
        let state = Volume::state_for(self.store.as_ref(), &self.state)?;
        Volume::open(self.store.clone(), Box::new(state), PW, &Self::opts())
    }
}

/// The contents that take each path of a scheme (docs/threat-model.md, note 1).
fn default_contents(scheme: SchemeId) -> &'static [Content] {
    match scheme {
        SchemeId::RandEint => &[Content::Pattern, Content::Text, Content::Mixed],
        SchemeId::CompEint => &[Content::Text, Content::Noise],
        SchemeId::CompEintZstd => &[Content::Pattern, Content::Mixed],
        _ => &[Content::Pattern],
    }
}

/// One attack on one intact scheme, for the report.
#[derive(Serialize, Clone)]
pub(crate) struct IntactRow {
    pub(crate) scheme: String,
    pub(crate) content: String,
    pub(crate) attack: usize,
    pub(crate) name: String,
    pub(crate) detected: bool,
    /// The error, or what was read.
    pub(crate) outcome: String,
    /// `as documented`, or why not.
    pub(crate) verdict: String,
}

/// Everything `bench attacks` found.
#[derive(Serialize, Default)]
pub(crate) struct AttacksReport {
    pub(crate) intact: Vec<IntactRow>,
    pub(crate) peers: Vec<PeerRun>,
    /// Peers asked for or installed that could not be attacked, and why.
    pub(crate) skipped: Vec<(String, String)>,
    /// intact outcomes that differ from docs/threat-model.md.
    pub(crate) unexpected: usize,
}

pub fn attacks(a: &AttacksArgs, json: bool) -> Result<()> {
    let r = run(a)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{}", markdown(&r));
    }
    if r.unexpected > 0 {
        bail!(
            "{} outcome(s) differ from what docs/threat-model.md documents (see above)",
            r.unexpected
        );
    }
    Ok(())
}

fn schemes_of(a: &AttacksArgs) -> Result<Vec<SchemeId>> {
    if a.schemes.is_empty() {
        return Ok(SchemeId::ALL.to_vec());
    }
    a.schemes
        .iter()
        .map(|s| SchemeId::parse(s).map_err(Into::into))
        .collect()
}

fn contents_of(a: &AttacksArgs) -> Result<Option<Vec<Content>>> {
    if a.content.is_empty() {
        return Ok(None);
    }
    a.content
        .iter()
        .map(|c| {
            Content::by_name(c)
                .with_context(|| format!("unknown content {c:?} (pattern, text, noise or mixed)"))
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// Runs what `a` asks for.
pub(crate) fn run(a: &AttacksArgs) -> Result<AttacksReport> {
    let schemes = schemes_of(a)?;
    let contents = contents_of(a)?;
    let peers = attack_peers::chosen(&a.peers)?;
    std::fs::create_dir_all(&a.workdir)
        .with_context(|| format!("creating {}", a.workdir.display()))?;
    let plan: Vec<(SchemeId, Content)> = schemes
        .iter()
        .flat_map(|&s| {
            contents
                .clone()
                .unwrap_or_else(|| default_contents(s).to_vec())
                .into_iter()
                .map(move |c| (s, c))
        })
        .collect();
    let pb = steps((plan.len() + peers.len()) as u64, "attacks");
    let mut r = AttacksReport::default();
    for (scheme, content) in plan {
        pb.set_message(format!("attacks on {} ({})", scheme.name(), content.name()));
        let copts = CreateOptions {
            block_size: 4096,
            scheme,
            auto: false,
            // Scratch volumes: the password's stretching plays no part in the attacks.
            kdf: KdfParams::TEST,
            ..CreateOptions::default()
        };
        let workdir = a.workdir.clone();
        let runs = attacks::run_all(
            &mut || Ok(Box::new(LocalBed::new(&workdir).map_err(io_err)?) as Box<dyn Bed>),
            &copts,
            content,
        )
        .with_context(|| format!("attacking {} ({})", scheme.name(), content.name()))?;
        for run in runs {
            let (detected, verdict) = match &run.verdict {
                Verdict::Detected => (true, "as documented".to_string()),
                Verdict::MissedAsDocumented => (false, "as documented".to_string()),
                Verdict::Unexpected(why) => {
                    r.unexpected += 1;
                    log(
                        &pb,
                        &format!(
                            "UNEXPECTED: {} ({}), attack {}: {why}",
                            scheme.name(),
                            content.name(),
                            run.attack.number
                        ),
                    );
                    (run.outcome.failure().is_some(), why.clone())
                }
            };
            r.intact.push(IntactRow {
                scheme: scheme.name().to_string(),
                content: content.name().to_string(),
                attack: run.attack.number,
                name: run.attack.name.to_string(),
                detected,
                outcome: run.outcome.text(),
                verdict,
            });
        }
        pb.inc(1);
    }
    for (kind, why) in attack_peers::unavailable(&a.peers) {
        r.skipped.push((kind, why));
    }
    for kind in peers {
        pb.set_message(format!("attacks on {}", kind.name()));
        match attack_peers::run_peer(kind, &a.workdir, &|line| log(&pb, line)) {
            Ok(runs) => r.peers.extend(runs),
            Err(e) => {
                log(
                    &pb,
                    &format!("{}: could not be attacked: {e:#}", kind.name()),
                );
                r.skipped.push((kind.name().to_string(), format!("{e:#}")));
            }
        }
        pb.inc(1);
    }
    pb.finish_and_clear();
    Ok(r)
}

fn io_err(e: anyhow::Error) -> intact_core::Error {
    intact_core::Error::Invalid(format!("{e:#}"))
}

/// The detection table: one row per attack, one column per scheme and peer.
pub(crate) fn markdown(r: &AttacksReport) -> String {
    let mut o = String::new();
    let mut schemes: Vec<String> = Vec::new();
    for row in &r.intact {
        if !schemes.contains(&row.scheme) {
            schemes.push(row.scheme.clone());
        }
    }
    let mut peers: Vec<String> = Vec::new();
    for p in &r.peers {
        if !peers.contains(&p.peer) {
            peers.push(p.peer.clone());
        }
    }
    let _ = writeln!(
        o,
        "Each attack on a fresh scratch volume, then the file read back (docs/threat-model.md). \
         \"yes\": the read (or the mount) failed with an integrity error; \"**no**\": the reader \
         got data with no error.\n"
    );
    let _ = write!(o, "| # | attack |");
    for s in schemes.iter().chain(&peers) {
        let _ = write!(o, " {s} |");
    }
    let _ = writeln!(o);
    let _ = writeln!(o, "|---|---|{}", "---|".repeat(schemes.len() + peers.len()));
    for a in &attacks::ATTACKS {
        let _ = write!(o, "| {} | {} |", a.number, a.name);
        for s in &schemes {
            // A scheme detects an attack when it does on every content tried.
            let rows: Vec<&IntactRow> = r
                .intact
                .iter()
                .filter(|x| &x.scheme == s && x.attack == a.number)
                .collect();
            let cell = if rows.iter().all(|x| x.detected) {
                "yes"
            } else {
                "**no**"
            };
            let _ = write!(o, " {cell} |");
        }
        for p in &peers {
            let cell = match r
                .peers
                .iter()
                .find(|x| &x.peer == p && x.attack == a.number)
            {
                Some(x) if x.detected => "yes".to_string(),
                Some(x) if x.no_effect => "(no effect)".to_string(),
                Some(_) => "**no**".to_string(),
                None => "—".to_string(),
            };
            let _ = write!(o, " {cell} |");
        }
        let _ = writeln!(o);
    }
    let _ = write!(o, "| | **detected** |");
    for s in &schemes {
        let n = attacks::ATTACKS
            .iter()
            .filter(|a| {
                r.intact
                    .iter()
                    .filter(|x| &x.scheme == s && x.attack == a.number)
                    .all(|x| x.detected)
            })
            .count();
        let _ = write!(o, " {n} of 12 |");
    }
    for p in &peers {
        let n = r
            .peers
            .iter()
            .filter(|x| &x.peer == p && x.detected)
            .count();
        let _ = write!(o, " {n} of 12 |");
    }
    let _ = writeln!(o, "\n");
    let mut tried: Vec<String> = Vec::new();
    for s in &schemes {
        let cs: Vec<&str> = r
            .intact
            .iter()
            .filter(|x| &x.scheme == s && x.attack == 1)
            .map(|x| x.content.as_str())
            .collect();
        tried.push(format!("{s} on {}", cs.join(", ")));
    }
    if !tried.is_empty() {
        let _ = writeln!(
            o,
            "intact, at library level in the local directory store; contents tried: {}. \
             Outcomes that differ from docs/threat-model.md: {}.\n",
            tried.join("; "),
            r.unexpected
        );
    }
    for p in &peers {
        let Some(first) = r.peers.iter().find(|x| &x.peer == p) else {
            continue;
        };
        let _ = writeln!(
            o,
            "{p} ({}), through its mount; it keeps {} bytes of local state beside the {} files \
             of its cipher directory:\n",
            first.version, first.local_state_bytes, first.cipher_files
        );
        for x in r.peers.iter().filter(|x| &x.peer == p) {
            let _ = writeln!(o, "- {} {}: {}", x.attack, x.name, x.got);
        }
        let _ = writeln!(o);
    }
    for (p, why) in &r.skipped {
        let _ = writeln!(o, "{p}: not attacked: {why}\n");
    }
    for row in r.intact.iter().filter(|x| x.verdict != "as documented") {
        let _ = writeln!(
            o,
            "UNEXPECTED: {} ({}), attack {}: {}\n",
            row.scheme, row.content, row.attack, row.verdict
        );
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scheme_on_the_local_store_is_as_documented() {
        let dir = tempfile::tempdir().unwrap();
        let a = AttacksArgs {
            schemes: vec!["mt-eint".into(), "aead".into(), "none".into()],
            content: vec![],
            peers: vec!["none".into()],
            workdir: dir.path().to_path_buf(),
        };
        let r = run(&a).unwrap();
        assert_eq!(r.intact.len(), 36);
        assert_eq!(r.unexpected, 0);
        let md = markdown(&r);
        // Totals: mt-eint all twelve, aead all but replay and file rollback, none three.
        assert!(
            md.contains("| | **detected** | 12 of 12 | 10 of 12 | 3 of 12 |"),
            "{md}"
        );
        assert!(md.contains("| 4 | one block replayed with its metadata | yes | **no** | **no** |"));
        // The scratch volumes are gone.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn bad_arguments_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = AttacksArgs {
            schemes: vec!["rot13".into()],
            content: vec![],
            peers: vec!["none".into()],
            workdir: dir.path().to_path_buf(),
        };
        assert!(run(&a).is_err());
        a.schemes = vec!["mt-eint".into()];
        a.content = vec!["zeros".into()];
        let e = run(&a).err().unwrap();
        assert!(format!("{e:#}").contains("unknown content"), "{e:#}");
        a.content = vec![];
        a.peers = vec!["bitlocker".into()];
        let e = run(&a).err().unwrap();
        assert!(format!("{e:#}").contains("unknown peer"), "{e:#}");
    }

    #[test]
    fn contents_cover_each_path_of_a_scheme() {
        assert_eq!(default_contents(SchemeId::RandEint).len(), 3);
        assert_eq!(
            default_contents(SchemeId::CompEint),
            &[Content::Text, Content::Noise]
        );
        assert_eq!(default_contents(SchemeId::MtEintGcm), &[Content::Pattern]);
    }
}
