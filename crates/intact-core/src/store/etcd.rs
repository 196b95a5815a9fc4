//! The trusted anchor in etcd (issue 9): one small trusted service for a volume of any
//! size, shared by the clients of several machines (docs/design.md, "The anchor in etcd").
//!
//! Under the key `KEY` given in the URL `etcd://HOST:PORT[,HOST:PORT...]/KEY`:
//! - `KEY/anchor` holds the anchor's bytes (the same bytes the local state directory keeps;
//!   they are authenticated by the volume's key, so etcd is trusted for freshness only);
//! - `KEY/writer` exists while a client holds the volume open for writing, attached to that
//!   client's lease (its value names the holder);
//! - `KEY/readers/<lease>` exists for each client holding it open read-only.
//!
//! **No fork.** Every store is a compare-and-swap: it replaces `KEY/anchor` only if the
//! anchor's revision is still the one this client last loaded or stored, and only while
//! this client's `KEY/writer` is the one it created. Two clients that both read epoch `e`
//! can never both seal an `e + 1`, and a writer whose lease expired (a network partition,
//! a paused process) can seal nothing once another may have taken over.
//!
//! **One writer.** Taking the lock is one transaction: create `KEY/writer` under a fresh
//! lease if neither it nor any `KEY/readers/` key exists (readers: create theirs if no
//! writer exists). The lease is kept alive every third of its time to live by a task of
//! this store's own runtime; a crashed client's lock goes with its lease.
//!
//! The client is etcd's maintained v3 client (`etcd-client`, gRPC) on a one-thread tokio
//! runtime owned by the store; every call has a deadline, so an unreachable etcd is a clear
//! error, never a hang.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse,
};

use super::trusted::{TrustedLock, TrustedStore};
use crate::error::{Error, Result};

/// The time to live of a client's lease, in seconds: a crashed writer's lock is free again
/// at most this long after its last keep-alive.
pub const LEASE_TTL_SECS: i64 = 10;
/// The deadline of every request to etcd.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Where an anchor in etcd lives: the endpoints and the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdUrl {
    /// `http://HOST:PORT`, one per member given.
    pub endpoints: Vec<String>,
    /// The key under which the volume's entries live (no leading `/`).
    pub key: String,
}

impl EtcdUrl {
    /// Parses `etcd://HOST:PORT[,HOST:PORT...]/KEY`.
    pub fn parse(url: &str) -> Result<EtcdUrl> {
        let bad = |why: &str| {
            Error::Invalid(format!(
                "{url:?}: {why} (expected etcd://HOST:PORT[,HOST:PORT...]/KEY)"
            ))
        };
        let rest = url
            .strip_prefix("etcd://")
            .ok_or_else(|| bad("not an etcd:// URL"))?;
        let (hosts, key) = rest
            .split_once('/')
            .ok_or_else(|| bad("no key after the host"))?;
        let key = key.trim_matches('/');
        if key.is_empty() {
            return Err(bad("the key is empty"));
        }
        if key
            .split('/')
            .any(|p| p.is_empty() || p == "." || p == "..")
        {
            return Err(bad("the key has an empty, `.` or `..` part"));
        }
        let mut endpoints = Vec::new();
        for h in hosts.split(',') {
            let (host, port) = h
                .rsplit_once(':')
                .ok_or_else(|| bad("a member has no port"))?;
            if host.is_empty() || port.parse::<u16>().is_err() {
                return Err(bad("a member is not HOST:PORT"));
            }
            endpoints.push(format!("http://{h}"));
        }
        Ok(EtcdUrl {
            endpoints,
            key: key.to_string(),
        })
    }

    fn anchor_key(&self) -> String {
        format!("{}/anchor", self.key)
    }

    fn writer_key(&self) -> String {
        format!("{}/writer", self.key)
    }

    fn readers_prefix(&self) -> String {
        format!("{}/readers/", self.key)
    }
}

impl std::fmt::Display for EtcdUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hosts: Vec<&str> = self
            .endpoints
            .iter()
            .map(|e| e.trim_start_matches("http://"))
            .collect();
        write!(f, "etcd://{}/{}", hosts.join(","), self.key)
    }
}

/// The lock this client holds in etcd, if any: its lease and the revision at which its
/// key was created (a store compares it, so a lost lease is never mistaken for ours).
#[derive(Debug, Clone, Copy)]
struct Held {
    lease: i64,
    created: i64,
    exclusive: bool,
}

struct Shared {
    url: EtcdUrl,
    rt: tokio::runtime::Runtime,
    client: Client,
    /// The anchor's revision as this client last loaded or stored it (0: none).
    seen: Mutex<i64>,
    held: Mutex<Option<Held>>,
    /// The lease's keep-alive failed (the lock may be gone).
    lease_lost: Arc<AtomicBool>,
}

/// The trusted anchor in etcd (see the module's documentation).
#[derive(Clone)]
pub struct EtcdAnchor {
    inner: Arc<Shared>,
}

impl std::fmt::Debug for EtcdAnchor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EtcdAnchor({})", self.inner.url)
    }
}

fn unreachable(url: &EtcdUrl, what: impl std::fmt::Display) -> Error {
    Error::io(
        url.to_string(),
        std::io::Error::other(format!("etcd: {what}")),
    )
}

/// An etcd client error in a line: a refused or lost connection says so, not the whole
/// transport chain.
fn short(e: &etcd_client::Error) -> String {
    match e {
        // gRPC's UNAVAILABLE (14): the connection was refused or lost.
        etcd_client::Error::GRpcStatus(s) if s.code() as i32 == 14 => {
            "etcd is unreachable (is it running, and is the address right?)".to_string()
        }
        etcd_client::Error::GRpcStatus(s) => format!("{:?}: {}", s.code(), s.message()),
        e => e.to_string(),
    }
}

impl Shared {
    /// Runs one request with the deadline.
    fn call<T, F>(&self, what: &str, f: F) -> Result<T>
    where
        F: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        self.rt
            .block_on(async { tokio::time::timeout(CALL_TIMEOUT, f).await })
            .map_err(|_| {
                unreachable(
                    &self.url,
                    format!(
                        "{what}: no answer within {} s (is etcd running and reachable?)",
                        CALL_TIMEOUT.as_secs()
                    ),
                )
            })?
            .map_err(|e| unreachable(&self.url, format!("{what}: {}", short(&e))))
    }

    fn client(&self) -> Client {
        self.client.clone()
    }

    /// The holder named in the writer key (with the key's creation revision) and the
    /// number of readers, for messages.
    fn holders(&self) -> Result<(Option<(String, i64)>, usize)> {
        let mut c = self.client();
        let w = self.call("reading the writer's key", async {
            c.get(self.url.writer_key(), None).await
        })?;
        let writer = w.kvs().first().map(|kv| {
            (
                String::from_utf8_lossy(kv.value()).into_owned(),
                kv.create_revision(),
            )
        });
        let mut c = self.client();
        let r = self.call("reading the readers' keys", async {
            c.get(
                self.url.readers_prefix(),
                Some(GetOptions::new().with_prefix().with_count_only()),
            )
            .await
        })?;
        Ok((writer, r.count() as usize))
    }

    fn revoke(&self, lease: i64) {
        let mut c = self.client();
        if let Err(e) = self.call("revoking the lease", async { c.lease_revoke(lease).await }) {
            tracing::warn!(error = %e, "cannot give the lease back (it expires by itself)");
        }
    }
}

/// What keeps a lock: dropping it stops the keep-alive and revokes the lease (its keys go).
struct LeaseGuard {
    shared: Arc<Shared>,
    lease: i64,
    keeper: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for LeaseGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "etcd lease {:x} on {}", self.lease, self.shared.url)
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        self.keeper.abort();
        let mut held = self.shared.held.lock().unwrap_or_else(|p| p.into_inner());
        if held.is_some_and(|h| h.lease == self.lease) {
            *held = None;
        }
        drop(held);
        self.shared.revoke(self.lease);
    }
}

impl EtcdAnchor {
    /// Connects to the etcd cluster of `url` (the connection is checked with a first
    /// request, so an unreachable etcd is reported here).
    pub fn connect(url: &EtcdUrl) -> Result<EtcdAnchor> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("intact-etcd")
            .enable_all()
            .build()
            .map_err(|e| Error::io(url.to_string(), e))?;
        let opts = ConnectOptions::new()
            .with_connect_timeout(CALL_TIMEOUT)
            .with_timeout(CALL_TIMEOUT)
            .with_keep_alive(Duration::from_secs(2), CALL_TIMEOUT);
        let client = rt
            .block_on(async {
                tokio::time::timeout(
                    CALL_TIMEOUT,
                    Client::connect(url.endpoints.clone(), Some(opts)),
                )
                .await
            })
            .map_err(|_| unreachable(url, "connecting: no answer (is etcd running?)"))?
            .map_err(|e| unreachable(url, format!("connecting: {e}")))?;
        let shared = Arc::new(Shared {
            url: url.clone(),
            rt,
            client,
            seen: Mutex::new(0),
            held: Mutex::new(None),
            lease_lost: Arc::new(AtomicBool::new(false)),
        });
        // A first request: connecting alone may succeed lazily.
        let mut c = shared.client();
        shared.call("connecting", async {
            c.get(url.anchor_key(), Some(GetOptions::new().with_count_only()))
                .await
        })?;
        Ok(EtcdAnchor { inner: shared })
    }

    /// The URL this anchor lives at.
    pub fn url(&self) -> &EtcdUrl {
        &self.inner.url
    }

    /// Whether this client's lease was lost (its keep-alive failed): a writer that lost it
    /// can seal nothing more.
    pub fn lease_lost(&self) -> bool {
        self.inner.lease_lost.load(Ordering::Relaxed)
    }

    /// Who holds the volume open for writing (the writer key's value), if anyone.
    pub fn writer(&self) -> Result<Option<String>> {
        Ok(self.inner.holders()?.0.map(|(w, _)| w))
    }

    /// The lease this client holds its lock with (tests revoke it to play a lost lease).
    pub fn lease_id(&self) -> Option<i64> {
        self.inner
            .held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map(|h| h.lease)
    }

    /// Revokes lease `id` as another client (or an operator) would.
    pub fn revoke_lease(&self, id: i64) -> Result<()> {
        let mut c = self.inner.client();
        self.inner
            .call("revoking a lease", async { c.lease_revoke(id).await })
            .map(|_| ())
    }

    /// Keeps `lease` alive from a task of the store's runtime: a keep-alive every third of
    /// its time to live, and through a short outage of etcd (the stream is opened again)
    /// until a whole time to live has passed without one; then the lease may be gone, and
    /// [`EtcdAnchor::lease_lost`] says so (a seal is refused anyway once its key is gone).
    fn keep_alive(&self, lease: i64) -> Result<tokio::task::JoinHandle<()>> {
        let s = &self.inner;
        let mut c = s.client();
        let first = s.call("keeping the lease alive", async {
            c.lease_keep_alive(lease).await
        })?;
        let lost = Arc::clone(&s.lease_lost);
        let url = s.url.to_string();
        let mut client = s.client();
        Ok(s.rt.spawn(async move {
            let every = Duration::from_secs((LEASE_TTL_SECS as u64 / 3).max(1));
            let ttl = Duration::from_secs(LEASE_TTL_SECS as u64);
            let mut last_ok = tokio::time::Instant::now();
            let mut stream = Some(first);
            loop {
                tokio::time::sleep(every).await;
                let once = async {
                    if stream.is_none() {
                        stream = Some(client.lease_keep_alive(lease).await.ok()?);
                    }
                    let (keeper, messages) = stream.as_mut()?;
                    keeper.keep_alive().await.ok()?;
                    let r = messages.message().await.ok()??;
                    Some(r.ttl())
                };
                match tokio::time::timeout(CALL_TIMEOUT, once).await {
                    Ok(Some(t)) if t > 0 => last_ok = tokio::time::Instant::now(),
                    Ok(Some(_)) => {
                        // etcd says the lease does not exist any more.
                        lost.store(true, Ordering::Relaxed);
                        tracing::error!(anchor = %url, "the etcd lease expired or was revoked: this client lost the volume's lock, and its seals are refused");
                        return;
                    }
                    _ => {
                        stream = None;
                        if last_ok.elapsed() >= ttl {
                            lost.store(true, Ordering::Relaxed);
                            tracing::error!(anchor = %url, "etcd was unreachable for the lease's whole time to live: this client may have lost the volume's lock, and its seals will be refused");
                            return;
                        }
                        tracing::warn!(anchor = %url, "cannot reach etcd to keep the lease alive; trying again");
                    }
                }
            }
        }))
    }
}

impl TrustedStore for EtcdAnchor {
    fn load(&self) -> Result<Option<Vec<u8>>> {
        let s = &self.inner;
        let mut c = s.client();
        let r = s.call("reading the anchor", async {
            c.get(s.url.anchor_key(), None).await
        })?;
        let kv = r.kvs().first();
        *s.seen.lock().unwrap_or_else(|p| p.into_inner()) = kv.map_or(0, |kv| kv.mod_revision());
        Ok(kv.map(|kv| kv.value().to_vec()))
    }

    /// Compare-and-swap: replaces the anchor only if it is still the one this client last
    /// loaded or stored, and (for a writer) only while this client's lock key is the one
    /// it created.
    fn store(&self, bytes: &[u8]) -> Result<()> {
        let s = &self.inner;
        let mut seen = s.seen.lock().unwrap_or_else(|p| p.into_inner());
        let held = *s.held.lock().unwrap_or_else(|p| p.into_inner());
        let mut when = vec![Compare::mod_revision(
            s.url.anchor_key(),
            CompareOp::Equal,
            *seen,
        )];
        if let Some(h) = held.filter(|h| h.exclusive) {
            when.push(Compare::create_revision(
                s.url.writer_key(),
                CompareOp::Equal,
                h.created,
            ));
        }
        let txn = Txn::new().when(when).and_then(vec![TxnOp::put(
            s.url.anchor_key(),
            bytes.to_vec(),
            None,
        )]);
        let mut c = s.client();
        let r = s.call("storing the anchor", async { c.txn(txn).await })?;
        if r.succeeded() {
            *seen = r.header().map_or(*seen, |h| h.revision());
            return Ok(());
        }
        drop(seen);
        // Why it was refused, for the message.
        let (writer, _) = s.holders()?;
        let why = match (held.filter(|h| h.exclusive), writer) {
            (Some(h), Some((_, created))) if created == h.created => "the anchor in etcd \
                 changed since this client read it: another client sealed the volume"
                .to_string(),
            (Some(_), Some((w, _))) => format!(
                "the volume's lock now belongs to another client ({w}): this client's lease \
                 expired or was revoked"
            ),
            (Some(_), None) => format!(
                "this client's lock is gone ({}), so another client may hold the volume now",
                if self.lease_lost() {
                    "its lease could not be kept alive"
                } else {
                    "its lease expired or was revoked"
                }
            ),
            (None, _) => "the anchor in etcd changed since this client read it: another \
                          client sealed the volume"
                .to_string(),
        };
        Err(Error::Locked(format!(
            "{}: the seal was refused, so that the volume cannot fork: {why}; nothing was \
             sealed (the last sealed epoch stays readable); reopen the volume",
            s.url
        )))
    }

    fn lock(&self, exclusive: bool) -> Result<TrustedLock> {
        let s = &self.inner;
        {
            let held = s.held.lock().unwrap_or_else(|p| p.into_inner());
            if held.is_some() {
                return Err(Error::Locked(format!(
                    "this process already holds the volume's lock in {}",
                    s.url
                )));
            }
        }
        let mut c = s.client();
        let lease = s
            .call("granting a lease", async {
                c.lease_grant(LEASE_TTL_SECS, None).await
            })?
            .id();
        let host = std::fs::read_to_string("/etc/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_default();
        let me = format!(
            "{} on {} (pid {}, lease {lease:x})",
            if exclusive { "writer" } else { "reader" },
            if host.is_empty() { "?" } else { &host },
            std::process::id()
        );
        let (key, when) = if exclusive {
            (
                s.url.writer_key(),
                vec![
                    Compare::create_revision(s.url.writer_key(), CompareOp::Equal, 0),
                    Compare::create_revision(s.url.readers_prefix(), CompareOp::Equal, 0)
                        .with_prefix(),
                ],
            )
        } else {
            (
                format!("{}{lease:x}", s.url.readers_prefix()),
                vec![Compare::create_revision(
                    s.url.writer_key(),
                    CompareOp::Equal,
                    0,
                )],
            )
        };
        let txn = Txn::new().when(when).and_then(vec![TxnOp::put(
            key,
            me,
            Some(PutOptions::new().with_lease(lease)),
        )]);
        let mut c = s.client();
        let r = match s.call("taking the lock", async { c.txn(txn).await }) {
            Ok(r) => r,
            Err(e) => {
                s.revoke(lease);
                return Err(e);
            }
        };
        if !r.succeeded() {
            s.revoke(lease);
            let (writer, readers) = s.holders()?;
            let who = match writer {
                Some((w, _)) => format!("another client has the volume open for writing: {w}"),
                None => format!("{readers} client(s) have the volume open read-only"),
            };
            return Err(Error::Locked(format!(
                "{who}; in {} (a client that crashed lets go within {LEASE_TTL_SECS} s, when \
                 its lease expires)",
                s.url
            )));
        }
        let created = r
            .op_responses()
            .first()
            .and_then(|o| match o {
                TxnOpResponse::Put(p) => p.header().map(|h| h.revision()),
                _ => None,
            })
            .or_else(|| r.header().map(|h| h.revision()))
            .unwrap_or(0);
        *s.held.lock().unwrap_or_else(|p| p.into_inner()) = Some(Held {
            lease,
            created,
            exclusive,
        });
        s.lease_lost.store(false, Ordering::Relaxed);
        let keeper = match self.keep_alive(lease) {
            Ok(k) => k,
            Err(e) => {
                *s.held.lock().unwrap_or_else(|p| p.into_inner()) = None;
                s.revoke(lease);
                return Err(e);
            }
        };
        Ok(TrustedLock::remote(
            exclusive,
            Box::new(LeaseGuard {
                shared: Arc::clone(s),
                lease,
                keeper,
            }),
        ))
    }

    fn location(&self) -> String {
        self.inner.url.to_string()
    }

    fn remove(&self) -> Result<()> {
        let s = &self.inner;
        let mut c = s.client();
        s.call("deleting the anchor", async {
            c.delete(s.url.anchor_key(), None).await
        })?;
        *s.seen.lock().unwrap_or_else(|p| p.into_inner()) = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_with_one_or_several_members() {
        let u = EtcdUrl::parse("etcd://127.0.0.1:2379/intact/vol1").unwrap();
        assert_eq!(u.endpoints, vec!["http://127.0.0.1:2379"]);
        assert_eq!(u.key, "intact/vol1");
        assert_eq!(u.anchor_key(), "intact/vol1/anchor");
        assert_eq!(u.writer_key(), "intact/vol1/writer");
        assert_eq!(u.readers_prefix(), "intact/vol1/readers/");
        assert_eq!(u.to_string(), "etcd://127.0.0.1:2379/intact/vol1");
        let u = EtcdUrl::parse("etcd://a:1,b:2/k/").unwrap();
        assert_eq!(u.endpoints, vec!["http://a:1", "http://b:2"]);
        assert_eq!(u.key, "k");
    }

    #[test]
    fn bad_urls_are_refused_with_the_reason() {
        for (url, why) in [
            ("http://h:1/k", "not an etcd:// URL"),
            ("etcd://h:1", "no key"),
            ("etcd://h:1/", "the key is empty"),
            ("etcd://h/k", "no port"),
            ("etcd://h:x/k", "not HOST:PORT"),
            ("etcd://:1/k", "not HOST:PORT"),
            ("etcd://h:1/a//b", "empty"),
            ("etcd://h:1/a/../b", "`..`"),
        ] {
            let e = EtcdUrl::parse(url).unwrap_err().to_string();
            assert!(e.contains(why), "{url}: {e}");
        }
    }
}
