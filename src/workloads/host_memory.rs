//! The host's memory, and this process's use of it. Settings are checked against the host's
//! memory before anything is allocated: a batch or a feature count typed with a few zeros too
//! many must be refused with the numbers, not grow the process until the OOM killer stops it.
//! Every built-in workload draws its data on the host first, so the host's memory bounds what
//! it can start.

use crate::record::RecordError;

const GIB: f64 = (1u64 << 30) as f64;

/// The host's memory in bytes (`MemTotal` of /proc/meminfo), or 1 TiB where the OS does not say.
pub fn host_memory_bytes() -> u64 {
    proc_bytes("/proc/meminfo", "MemTotal").unwrap_or(1 << 40)
}

/// This process's peak resident memory in bytes (`VmHWM` of /proc/self/status), where the OS
/// says (Linux).
pub fn peak_resident_bytes() -> Option<u64> {
    proc_bytes("/proc/self/status", "VmHWM")
}

/// The value of a `KEY:  N kB` line of a /proc file, in bytes.
fn proc_bytes(file: &str, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(file).ok()?;
    let line = text.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))?;
    let kib: u64 = line.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib * 1024)
}

/// Refuses `what` when its `count` elements of `elem_bytes` bytes each exceed the host's memory
/// (or do not fit in a u64 at all), naming the setting to lower.
pub fn check_fits(what: &str, count: u128, elem_bytes: u128, setting: &str) -> Result<(), RecordError> {
    check_fits_in(what, count, elem_bytes, setting, host_memory_bytes())
}

fn check_fits_in(what: &str, count: u128, elem_bytes: u128, setting: &str, memory: u64) -> Result<(), RecordError> {
    let bytes = count.saturating_mul(elem_bytes);
    if bytes > u128::from(memory) {
        return Err(RecordError::Unsupported(format!(
            "{what} would take {:.1} GiB, more than this machine's {:.1} GiB of memory: lower {setting}",
            bytes as f64 / GIB,
            memory as f64 / GIB
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_beyond_the_memory_are_refused_with_the_setting_to_lower() {
        let gib = 1u64 << 30;
        assert!(check_fits_in("x", 1 << 20, 4, "--batch", gib).is_ok());
        let err = check_fits_in("the adder's batch", 10_000 * 100_000_000, 4, "--batch or --features", 64 * gib)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "the adder's batch would take 3725.3 GiB, more than this machine's 64.0 GiB of memory: lower --batch or --features"
        );
        // Products past u64 saturate rather than wrap.
        assert!(check_fits_in("x", u128::MAX, 8, "--batch", gib).is_err());
    }

    #[test]
    fn proc_lines_are_read_by_key_in_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("meminfo");
        std::fs::write(&file, "MemTotalish:  1 kB\nMemTotal:       24576 kB\nVmHWM:\t  10 kB\n").unwrap();
        let file = file.to_str().unwrap();
        assert_eq!(proc_bytes(file, "MemTotal"), Some(24576 * 1024), "not the line whose key only starts so");
        assert_eq!(proc_bytes(file, "VmHWM"), Some(10 * 1024));
        assert_eq!(proc_bytes(file, "VmRSS"), None);
    }
}
