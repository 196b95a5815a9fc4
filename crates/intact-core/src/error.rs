//! One error type for the core, keeping integrity failures, I/O and configuration apart.

use std::fmt;

/// Result alias used throughout the core.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Where an integrity failure was found: a path when the engine knows it, else an inode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    /// A file known by its path in the volume.
    Path(String),
    /// A file known by its inode number (the path is not known at this layer).
    Inode(u64),
    /// The inode table, which anchors every file.
    InodeTable,
    /// The trusted anchor.
    Anchor,
    /// The commit journal.
    Journal,
    /// The volume configuration.
    Config,
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Subject::Path(p) => write!(f, "{p}"),
            Subject::Inode(i) => write!(f, "inode {i}"),
            Subject::InodeTable => write!(f, "<inode table>"),
            Subject::Anchor => write!(f, "<trusted anchor>"),
            Subject::Journal => write!(f, "<journal>"),
            Subject::Config => write!(f, "<volume config>"),
        }
    }
}

/// Every failure the core reports.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Stored data failed authentication or freshness: the untrusted store was modified,
    /// swapped, rolled back or lost data. Never a benign condition.
    #[error("integrity failure: {subject}: {}{what}", block.map(|b| format!("block {b}: ")).unwrap_or_default())]
    Tampered {
        /// The file (or structure) that failed.
        subject: Subject,
        /// The block index within it, where one applies.
        block: Option<u64>,
        /// What exactly failed.
        what: String,
    },
    /// An I/O error of a store.
    #[error("I/O error on {what}: {source}")]
    Io {
        /// The object or path being accessed.
        what: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The password does not open the volume (or the key envelope was modified).
    #[error("wrong password (or the volume config's key envelope was modified)")]
    WrongPassword,
    /// The volume configuration is unreadable or inconsistent.
    #[error("volume config: {0}")]
    Config(String),
    /// The trusted anchor is missing: not tampering, but freshness cannot be established.
    #[error("the trusted anchor for volume {volume} is missing from {dir}; if you moved or lost the state directory, see `intact recover-anchor --help`")]
    AnchorMissing {
        /// Volume id (hex).
        volume: String,
        /// The state directory searched.
        dir: String,
    },
    /// The trusted anchor itself is corrupt (it lives on trusted storage, so this is local damage).
    #[error("trusted anchor: {0}")]
    AnchorCorrupt(String),
    /// Another process holds the volume.
    #[error("volume is in use by another process ({0})")]
    Locked(String),
    /// A path or argument problem reported to the user.
    #[error("{path}: {kind}")]
    Fs {
        /// The path concerned.
        path: String,
        /// What is wrong.
        kind: FsErrorKind,
    },
    /// An earlier commit or flush failed; the open volume refuses further work (nothing
    /// that was sealed is lost; what was not is not half-applied).
    #[error("the volume must be reopened after a failed commit: {0}")]
    Poisoned(String),
    /// Changes to a file that were not sealed yet were discarded when a commit failed (a
    /// full or failing store): the volume went back to its last seal and goes on from
    /// there. Reported once, by the next fsync (or close) of the file, as a writeback
    /// error is on Linux.
    #[error("{what}: unsealed changes were lost when a commit failed ({cause}); the volume went back to its last seal")]
    Lost {
        /// The file (path or inode).
        what: String,
        /// Why the commit failed.
        cause: String,
        /// The OS error of the failure, when it was one (ENOSPC, EIO, ...).
        errno: Option<i32>,
    },
    /// An invalid argument.
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// The volume failed authentication as a whole when opened (the cipher directory and the
    /// trusted anchor disagree): the failure, with what each side holds, the likely causes
    /// and the next commands ([`crate::volume::StateReport::explain`]).
    #[error("{cause}\n\n{}", report.explain())]
    StateMismatch {
        /// The integrity failure.
        cause: Box<Error>,
        /// What the anchor and the store say.
        report: Box<crate::volume::StateReport>,
    },
    /// The store was crashed by the fault-injecting wrapper (tests only).
    #[error("simulated crash")]
    Crashed,
}

/// File-system level errors that map to errno values in front ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsErrorKind {
    /// ENOENT
    NotFound,
    /// EEXIST
    Exists,
    /// ENOTDIR
    NotADirectory,
    /// EISDIR
    IsADirectory,
    /// ENOTEMPTY
    NotEmpty,
    /// ENAMETOOLONG
    NameTooLong,
    /// EINVAL
    InvalidName,
    /// EFBIG
    TooLarge,
    /// EROFS
    ReadOnly,
    /// EXDEV/EINVAL: renaming a directory into itself
    RenameIntoSelf,
    /// No such extended attribute.
    NoAttribute,
    /// The operation is not permitted on this kind of inode (e.g. a hard link to a directory).
    NotPermitted,
    /// A name or value is longer than the format allows.
    ValueTooLarge,
    /// The operation is not supported (e.g. an attribute namespace other than `user.`).
    NotSupported,
    /// ENOSPC: a per-inode limit is reached (the extended attributes' total size).
    NoSpace,
}

impl fmt::Display for FsErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FsErrorKind::NotFound => "no such file or directory",
            FsErrorKind::Exists => "already exists",
            FsErrorKind::NotADirectory => "not a directory",
            FsErrorKind::IsADirectory => "is a directory",
            FsErrorKind::NotEmpty => "directory not empty",
            FsErrorKind::NameTooLong => "name too long",
            FsErrorKind::InvalidName => "invalid name",
            FsErrorKind::TooLarge => "file too large",
            FsErrorKind::ReadOnly => "volume opened read-only",
            FsErrorKind::RenameIntoSelf => "cannot move a directory into itself",
            FsErrorKind::NoAttribute => "no such attribute",
            FsErrorKind::NotPermitted => "operation not permitted",
            FsErrorKind::ValueTooLarge => "value too large",
            FsErrorKind::NotSupported => "operation not supported",
            FsErrorKind::NoSpace => "no space left for this inode",
        })
    }
}

impl Error {
    /// Builds an I/O error naming what was accessed.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            what: what.into(),
            source,
        }
    }

    /// Builds an integrity error.
    pub fn tampered(subject: Subject, block: Option<u64>, what: impl Into<String>) -> Self {
        Error::Tampered {
            subject,
            block,
            what: what.into(),
        }
    }

    /// Builds a file-system error for a path.
    pub fn fs(path: impl Into<String>, kind: FsErrorKind) -> Self {
        Error::Fs {
            path: path.into(),
            kind,
        }
    }

    /// Names `path` in an error raised below the path layer: an integrity failure that only
    /// knew the inode, or a file-system error raised without a path.
    pub fn at_path(self, path: &str) -> Self {
        match self {
            Error::Fs { path: p, kind } if p.is_empty() => Error::Fs {
                path: path.to_string(),
                kind,
            },
            other => other.with_subject(Subject::Path(path.to_string())),
        }
    }

    /// Names `path` in a file-system error raised by an operation on one of its
    /// components (which only knew the component's name).
    pub fn in_path(self, path: &str) -> Self {
        match self {
            Error::Fs { kind, .. } => Error::Fs {
                path: path.to_string(),
                kind,
            },
            other => other,
        }
    }

    /// True for integrity (tamper) failures.
    pub fn is_tampered(&self) -> bool {
        matches!(self, Error::Tampered { .. } | Error::StateMismatch { .. })
    }

    /// Names the file of an integrity failure that only knew the inode (used when a layer
    /// learns the path); a failure already naming a path or structure keeps its subject.
    pub fn with_subject(self, subject: Subject) -> Self {
        match self {
            Error::Tampered {
                subject: Subject::Inode(_),
                block,
                what,
            } => Error::Tampered {
                subject,
                block,
                what,
            },
            other => other,
        }
    }
}

/// An error kept to be reported again, to every caller it concerns (the waiters of a failed
/// log write, the fsyncs after a failed commit): its text, its OS error number, and whether
/// it was the fault-injecting store's simulated power cut.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    pub(crate) cause: String,
    pub(crate) errno: Option<i32>,
    /// The fault-injecting store's simulated power cut: nothing may run after it.
    pub(crate) crashed: bool,
}

impl Failure {
    pub(crate) fn of(e: &Error) -> Failure {
        Failure {
            cause: e.to_string(),
            errno: match e {
                Error::Io { source, .. } => source.raw_os_error(),
                _ => None,
            },
            crashed: matches!(e, Error::Crashed),
        }
    }

    /// What was lost to it: [`Error::Lost`] of `what`.
    pub(crate) fn lost(&self, what: impl Into<String>) -> Error {
        Error::Lost {
            what: what.into(),
            cause: self.cause.clone(),
            errno: self.errno,
        }
    }

    /// It again, as an I/O error on `what` (the simulated power cut as itself).
    pub(crate) fn io_error(&self, what: &str) -> Error {
        if self.crashed {
            return Error::Crashed;
        }
        let source = match self.errno {
            Some(n) => std::io::Error::from_raw_os_error(n),
            None => std::io::Error::other(self.cause.clone()),
        };
        Error::io(format!("{what} ({})", self.cause), source)
    }
}
