//! Transparent huge pages for the heap (docs/performance.md, "Huge pages for the heap").
//!
//! The engine's caches and staging structures are reached at random: a node cache, the
//! metadata cache, a transaction's overlay, a file's counter intervals, hash maps of
//! inodes. Where the kernel gives transparent huge pages only to memory that asks for them
//! (`/sys/kernel/mm/transparent_hugepage/enabled` is `madvise`, the default of Debian and
//! Ubuntu), glibc's heap never asks, and every random access to a cold 4 KiB page pays a
//! TLB miss. Under a hypervisor that walk is two-dimensional: on the 2-core KVM guest these
//! numbers come from, a random read of a 1 GiB array costs 243–859 ns on 4 KiB pages and
//! 21–56 ns on 2 MiB ones, and a `HashMap` lookup among 10^6 names 3.9–14 µs against
//! 0.7 µs.
//!
//! glibc asks for huge pages for its heap when the tunable `glibc.malloc.hugetlb=1` is
//! set (glibc 2.35 and later; older ones ignore it), and tunables are read only when a
//! program starts. So `intact` starts itself again, once, with the tunable added to the
//! environment: an `exec` of the same binary with the same arguments, in the same process
//! (same pid, same open descriptors). Nothing happens when the kernel's mode is not
//! `madvise` (`always` gives huge pages already, `never` gives none), when the caller set
//! the tunable either way, or when `INTACT_HUGE_PAGES=0`.

use std::ffi::OsString;

/// The tunable added to `GLIBC_TUNABLES`.
const TUNABLE: &str = "glibc.malloc.hugetlb";

/// Where the kernel says which memory gets transparent huge pages.
const THP_MODE: &str = "/sys/kernel/mm/transparent_hugepage/enabled";

/// The `GLIBC_TUNABLES` to start again with, or `None` to go on as started: `thp` is the
/// kernel's mode file (`always [madvise] never`), `tunables` the current value, `opt` the
/// value of `INTACT_HUGE_PAGES`.
pub fn tunables_to_set(
    thp: Option<&str>,
    tunables: Option<&str>,
    opt: Option<&str>,
) -> Option<String> {
    if opt.is_some_and(|v| matches!(v.trim(), "0" | "off" | "no" | "false")) {
        return None;
    }
    if !thp?.contains("[madvise]") {
        return None;
    }
    match tunables.map(str::trim).filter(|t| !t.is_empty()) {
        // The caller chose (either way): theirs stands.
        Some(t) if t.split(':').any(|kv| kv.split('=').next() == Some(TUNABLE)) => None,
        // First: glibc cuts the variable at each `:` as it reads it, so what
        // `/proc/PID/environ` shows afterwards is the first tunable only.
        Some(t) => Some(format!("{TUNABLE}=1:{t}")),
        None => Some(format!("{TUNABLE}=1")),
    }
}

/// Starts this program again with huge pages for its heap where [`tunables_to_set`] says
/// so; returns only when it does not (or when the `exec` fails: then it goes on as it is).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn restart_with_huge_pages() {
    use std::os::unix::process::CommandExt;
    let thp = std::fs::read_to_string(THP_MODE).ok();
    let tunables = std::env::var("GLIBC_TUNABLES").ok();
    let opt = std::env::var("INTACT_HUGE_PAGES").ok();
    let Some(value) = tunables_to_set(thp.as_deref(), tunables.as_deref(), opt.as_deref()) else {
        return;
    };
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let mut args = std::env::args_os();
    let arg0 = args.next().unwrap_or_else(|| OsString::from("intact"));
    // `exec` returns only on failure: the program goes on without huge pages.
    let err = std::process::Command::new(exe)
        .arg0(arg0)
        .args(args)
        .env("GLIBC_TUNABLES", value)
        .exec();
    tracing::debug!(error = %err, "could not start again with huge pages for the heap");
}

/// Not glibc on Linux: nothing to do.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn restart_with_huge_pages() {}

#[cfg(test)]
mod tests {
    use super::tunables_to_set;

    const MADVISE: Option<&str> = Some("always [madvise] never\n");

    #[test]
    fn the_tunable_is_added_only_where_the_kernel_waits_to_be_asked() {
        assert_eq!(
            tunables_to_set(MADVISE, None, None).as_deref(),
            Some("glibc.malloc.hugetlb=1")
        );
        assert_eq!(
            tunables_to_set(Some("[always] madvise never"), None, None),
            None
        );
        assert_eq!(
            tunables_to_set(Some("always madvise [never]"), None, None),
            None
        );
        // No mode file (not Linux, or no THP support): nothing to ask for.
        assert_eq!(tunables_to_set(None, None, None), None);
    }

    #[test]
    fn other_tunables_are_kept_and_the_callers_choice_stands() {
        assert_eq!(
            tunables_to_set(MADVISE, Some("glibc.malloc.arena_max=2"), None).as_deref(),
            Some("glibc.malloc.hugetlb=1:glibc.malloc.arena_max=2")
        );
        assert_eq!(
            tunables_to_set(MADVISE, Some(""), None).as_deref(),
            Some("glibc.malloc.hugetlb=1")
        );
        for set in [
            "glibc.malloc.hugetlb=0",
            "glibc.malloc.hugetlb=1",
            "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=2",
        ] {
            assert_eq!(tunables_to_set(MADVISE, Some(set), None), None, "{set}");
        }
        // A tunable whose name only starts the same is another one.
        assert_eq!(
            tunables_to_set(MADVISE, Some("glibc.malloc.hugetlbx=1"), None).as_deref(),
            Some("glibc.malloc.hugetlb=1:glibc.malloc.hugetlbx=1")
        );
    }

    #[test]
    fn intact_huge_pages_0_turns_it_off() {
        for off in ["0", "off", "no", "false", " 0\n"] {
            assert_eq!(tunables_to_set(MADVISE, None, Some(off)), None, "{off:?}");
        }
        assert!(tunables_to_set(MADVISE, None, Some("1")).is_some());
    }
}
