//! The programs a command runs (`-- CMD`), owned with every process they start, and stopped
//! exactly those: on Linux, in a cgroup v2 of their own where the machine lets repro make one
//! (stopped at once with `cgroup.kill`, which no `setsid` or double fork escapes), else as the
//! descendants of this process, a child subreaper (each frozen with SIGSTOP so that none forks
//! away, then killed by pid; a process group is killed whole only when every member is the
//! program's, so a group a descendant joined is never taken down with it). If this process is
//! killed outright (SIGKILL), the program still goes with it: its first process dies with it
//! (`PR_SET_PDEATHSIG`), and a cgroup's guardian, a second `repro` process started beside the
//! program and told of this one's death the same way, kills the cgroup. (The descendants' way
//! has no guardian: there, only the first process dies with this one.)
//! `REPRO_SUPERVISE=descendants` asks for the second way where the first is possible
//! (docs/capture.md, "Stopping a program").

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Asks for the descendants' way where a cgroup could be made (`descendants`), or for the
/// default (unset, or `cgroup`).
pub const SUPERVISE_ENV: &str = "REPRO_SUPERVISE";

/// Tells a `repro` process started as a cgroup's guardian (see [`guard`]) which cgroup it
/// guards.
const GUARD_ENV: &str = "REPRO_GUARD_CGROUP";
/// The process id of the `repro` a guardian guards for.
const GUARD_PARENT_ENV: &str = "REPRO_GUARD_PARENT";

/// A program started under supervision: its process (and group) id, and its cgroup if it runs
/// in one of its own, with the guardian's process id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Program {
    leader: u32,
    cgroup: Option<PathBuf>,
    guardian: Option<u32>,
}

/// Programs running, to stop if the command is interrupted.
static PROGRAMS: Mutex<Vec<Program>> = Mutex::new(Vec::new());

/// Starts `command` supervised: in a process group of its own, in a cgroup of its own where
/// one can be made, dying with this process. Stop it with [`Program::stop`] and let it go with
/// [`Program::release`].
pub fn spawn(command: &mut Command) -> std::io::Result<(Child, Program)> {
    #[cfg(unix)]
    std::os::unix::process::CommandExt::process_group(command, 0);
    // Listening before the program starts; the handler waits for the list until the program is
    // in it, guardian and all, so that an interrupt at any moment stops it.
    super::interrupt::on_interrupt(super::interrupt::Stage::StopPrograms, stop_all);
    let mut programs = PROGRAMS.lock().unwrap_or_else(|p| p.into_inner());
    let cgroup = own_cgroup();
    prepare_child(command, cgroup.as_deref());
    adopt_orphans();
    let child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            if let Some(dir) = &cgroup {
                let _ = std::fs::remove_dir(dir);
            }
            return Err(e);
        }
    };
    // A cgroup the child could not move into holds nothing: the descendants' way then.
    let cgroup = match cgroup {
        Some(dir) if members(&dir).contains(&child.id()) => Some(dir),
        Some(dir) => {
            let _ = std::fs::remove_dir(&dir);
            None
        }
        None => None,
    };
    let guardian = cgroup.as_deref().and_then(start_guardian);
    let program = Program { leader: child.id(), cgroup, guardian };
    programs.push(program.clone());
    Ok((child, program))
}

impl Program {
    /// How its processes are owned, for messages: `a cgroup of its own` or `this process's
    /// descendants`.
    pub fn owned_by(&self) -> &'static str {
        match self.cgroup {
            Some(_) => "a cgroup of its own",
            None => "this process's descendants",
        }
    }

    /// Stops the program with every process it started (SIGKILL), those that left its process
    /// group or session included.
    pub fn stop(&self) {
        match &self.cgroup {
            Some(dir) => kill_cgroup(dir),
            None => stop_descendants(self.leader),
        }
    }

    /// Stops what the program left running, removes its cgroup, and forgets it.
    pub fn release(self) {
        self.stop();
        self.dismiss_guardian();
        if let Some(dir) = &self.cgroup {
            // Emptied by the kill; a process exiting late keeps it for a moment.
            let deadline = Instant::now() + Duration::from_secs(2);
            while std::fs::remove_dir(dir).is_err() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        PROGRAMS.lock().unwrap_or_else(|p| p.into_inner()).retain(|p| *p != self);
    }
}

/// Stops every program still running (the command is being interrupted).
pub fn stop_all() {
    for program in PROGRAMS.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
        program.stop();
        program.dismiss_guardian();
        if let Some(dir) = &program.cgroup {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

impl Program {
    /// Ends the guardian, its cgroup taken care of.
    fn dismiss_guardian(&self) {
        if let Some(pid) = self.guardian {
            #[cfg(unix)]
            // SAFETY: kill and a blocking waitpid on our own child only signal and reap it.
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGKILL);
                libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), 0);
            }
        }
    }
}

/// Starts this binary again as the guardian of `cgroup` (see [`guard`]): in a process group of
/// its own (a Ctrl-C to the terminal's is not for it), told of this process's death by SIGTERM.
/// Its process id, or None where it could not start (the cgroup then has none).
fn start_guardian(cgroup: &Path) -> Option<u32> {
    let exe = std::env::current_exe().ok()?;
    let mut command = Command::new(exe);
    command
        .env(GUARD_ENV, cgroup)
        .env(GUARD_PARENT_ENV, std::process::id().to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    #[cfg(unix)]
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: the closure runs in the child between fork and exec and calls only
        // async-signal-safe functions (sigemptyset, sigaddset, sigprocmask, prctl, getppid).
        unsafe {
            command.pre_exec(move || {
                // SIGTERM stays pending (the mask survives exec) until the guardian listens for
                // it: a repro killed while its guardian starts must not kill the guardian first.
                let mut term: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut term);
                libc::sigaddset(&mut term, libc::SIGTERM);
                libc::sigprocmask(libc::SIG_BLOCK, &term, std::ptr::null_mut());
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::getppid() != parent {
                    return Err(std::io::Error::other("the supervisor exited before its guardian started"));
                }
                Ok(())
            });
        }
    }
    command.spawn().ok().map(|child| child.id())
}

/// Runs this process as a cgroup's guardian when started as one (`REPRO_GUARD_CGROUP` names
/// the cgroup; `None` otherwise): it waits for SIGTERM, which the kernel sends when the `repro`
/// that started it dies, then kills the cgroup and removes it. The `repro` that started it
/// kills it (SIGKILL) once it has stopped the program itself.
pub fn guard() -> Option<super::Exit> {
    let dir = PathBuf::from(std::env::var_os(GUARD_ENV)?);
    let cgroup = std::fs::read_dir(&dir).is_ok() && dir.join("cgroup.kill").exists();
    if !cgroup {
        return Some(super::Exit::Error);
    }
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP]) else {
        return Some(super::Exit::Error);
    };
    // Listening now: let a SIGTERM blocked since the start (see `start_guardian`) in.
    #[cfg(unix)]
    // SAFETY: sigemptyset, sigaddset and pthread_sigmask only change this thread's signal mask.
    unsafe {
        let mut term: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut term);
        libc::sigaddset(&mut term, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &term, std::ptr::null_mut());
    }
    // The supervisor may have died between the spawn and the handler: then no SIGTERM comes.
    let parent: Option<u32> = std::env::var(GUARD_PARENT_ENV).ok().and_then(|p| p.parse().ok());
    #[cfg(unix)]
    // SAFETY: getppid only reads this process's parent id.
    let orphaned = parent != Some(unsafe { libc::getppid() } as u32);
    #[cfg(not(unix))]
    let orphaned = parent.is_none();
    if !orphaned {
        let _ = signals.forever().next();
    }
    kill_cgroup(&dir);
    let _ = std::fs::remove_dir(&dir);
    Some(super::Exit::Same)
}

/// A new cgroup v2 below this process's own, where the machine has cgroup v2 mounted, lets
/// repro create one and can kill one (`cgroup.kill`, Linux 5.14); None otherwise, or when
/// `REPRO_SUPERVISE=descendants`.
fn own_cgroup() -> Option<PathBuf> {
    if std::env::var(SUPERVISE_ENV).is_ok_and(|v| v == "descendants") {
        return None;
    }
    let mount = cgroup2_mount()?;
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = own.lines().find_map(|l| l.strip_prefix("0::"))?;
    let parent = mount.join(path.trim_start_matches('/'));
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = parent.join(format!("repro-{}-{n}", std::process::id()));
    std::fs::create_dir(&dir).ok()?;
    if !dir.join("cgroup.kill").exists() {
        let _ = std::fs::remove_dir(&dir);
        return None;
    }
    Some(dir)
}

/// Where cgroup v2 is mounted (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` beside v1).
fn cgroup2_mount() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    mounts.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        let (_, at, kind) = (fields.next()?, fields.next()?, fields.next()?);
        (kind == "cgroup2").then(|| PathBuf::from(at))
    })
}

/// The processes in a cgroup.
fn members(dir: &Path) -> Vec<u32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .map(|text| text.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// Kills every process in the cgroup at once, waits until it is empty, and reaps those that
/// were this process's children (adopted orphans included).
fn kill_cgroup(dir: &Path) {
    let before = members(dir);
    let _ = std::fs::write(dir.join("cgroup.kill"), "1");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !members(dir).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    reap(&before);
}

/// Reaps, without waiting, those of `pids` that are this process's exited children.
fn reap(pids: &[u32]) {
    #[cfg(unix)]
    for &pid in pids {
        // SAFETY: a non-blocking waitpid on a given pid only reaps it if it is an exited child.
        unsafe {
            libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), libc::WNOHANG);
        }
    }
    #[cfg(not(unix))]
    let _ = pids;
}

/// Makes `command`'s child die with this process (see [`prepare_child`]): the ranks a command
/// starts itself, which stop on their own.
pub fn die_with_this_process(command: &mut Command) {
    prepare_child(command, None);
}

/// Makes the child, between fork and exec: move into `cgroup` (so that everything it starts is
/// there too), and die with this process, however this process ends (a cancelled CI job's
/// SIGKILL included; Linux: the kernel sends it SIGKILL when its parent exits; a child that
/// would start after its parent already died does not start). Linux ties the signal to the
/// thread that spawns the child, so spawn from the main thread (every caller does).
fn prepare_child(command: &mut Command, cgroup: Option<&Path>) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        let procs =
            cgroup.and_then(|dir| CString::new(dir.join("cgroup.procs").into_os_string().into_encoded_bytes()).ok());
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: the closure runs in the child between fork and exec and calls only
        // async-signal-safe functions (open, write, close, prctl, getppid) on memory made before
        // the fork.
        unsafe {
            command.pre_exec(move || {
                if let Some(procs) = &procs {
                    // "0": the writing process. A failure leaves it where it was (seen after
                    // the spawn, which then supervises it the other way).
                    let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if fd >= 0 {
                        libc::write(fd, b"0".as_ptr().cast(), 1);
                        libc::close(fd);
                    }
                }
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::getppid() != parent {
                    return Err(std::io::Error::other("the supervisor exited before this program started"));
                }
                Ok(())
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (command, cgroup);
}

/// Makes this process adopt the orphans of the programs it starts (Linux: a child subreaper),
/// so that their descendants stay its descendants after the program itself exited.
fn adopt_orphans() {
    #[cfg(target_os = "linux")]
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER only sets a flag of this process.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1);
    }
}

/// A living process as /proc says: its id, parent and process group.
#[derive(Debug, Clone, Copy)]
struct Process {
    pid: u32,
    parent: u32,
    group: u32,
}

/// Every living process (zombies left out: they hold nothing), from /proc.
fn processes() -> Vec<Process> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        // `pid (command) state ppid pgrp ...`: the command may hold spaces and parentheses.
        let Some((_, after)) = stat.rsplit_once(')') else { continue };
        let mut fields = after.split_whitespace();
        let state = fields.next();
        let (Some(Ok(parent)), Some(Ok(group))) =
            (fields.next().map(str::parse::<u32>), fields.next().map(str::parse::<u32>))
        else {
            continue;
        };
        if state != Some("Z") {
            found.push(Process { pid, parent, group });
        }
    }
    found
}

/// The processes below `roots` (by parent, transitively), this process excluded.
fn descendants(all: &[Process], roots: &[u32]) -> Vec<u32> {
    let me = std::process::id();
    let mut found: Vec<u32> = Vec::new();
    let mut queue: Vec<u32> = roots.to_vec();
    while let Some(pid) = queue.pop() {
        for p in all.iter().filter(|p| p.parent == pid && p.pid != me) {
            if !found.contains(&p.pid) {
                found.push(p.pid);
                queue.push(p.pid);
            }
        }
    }
    found
}

/// Stops the program `leader` and its descendants without a cgroup: every descendant (those
/// orphaned were adopted by this process, so they are found as its own) is frozen with SIGSTOP
/// until a scan finds no new one, so that none forks away meanwhile; then each is killed by pid,
/// and each of their process groups whose every member is among them is killed whole.
fn stop_descendants(leader: u32) {
    #[cfg(target_os = "linux")]
    {
        let me = std::process::id();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let mut frozen: Vec<u32> = Vec::new();
            let all = loop {
                let all = processes();
                let found: Vec<u32> = descendants(&all, &[leader, me]);
                let new: Vec<u32> = found.iter().copied().filter(|p| !frozen.contains(p)).collect();
                if new.is_empty() || Instant::now() > deadline {
                    break all;
                }
                for &pid in &new {
                    // SAFETY: kill only sends a signal; a process already gone makes it fail.
                    unsafe { libc::kill(pid as libc::pid_t, libc::SIGSTOP) };
                }
                frozen.extend(new);
            };
            if frozen.is_empty() {
                return;
            }
            let mut groups: Vec<u32> = all.iter().filter(|p| frozen.contains(&p.pid)).map(|p| p.group).collect();
            groups.sort_unstable();
            groups.dedup();
            // SAFETY: kill and killpg only send signals; a process or group already gone makes
            // them fail harmlessly.
            unsafe {
                for group in groups {
                    let whole = all.iter().filter(|p| p.group == group).all(|p| frozen.contains(&p.pid));
                    if whole {
                        libc::killpg(group as libc::pid_t, libc::SIGKILL);
                    }
                }
                for &pid in &frozen {
                    libc::kill(pid as libc::pid_t, libc::SIGKILL);
                }
            }
            reap(&frozen);
            if Instant::now() > deadline {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    #[cfg(all(unix, not(target_os = "linux")))]
    // SAFETY: killpg only sends a signal; a group that is gone makes it fail harmlessly.
    unsafe {
        libc::killpg(leader as libc::pid_t, libc::SIGKILL);
    }
    #[cfg(not(unix))]
    let _ = leader;
}
