//! Where launched ranks meet, over TCP, and the CPU stand-in's sums between them.
//!
//! Rank 0 listens at `MASTER_ADDR:MASTER_PORT` (that address, not every interface); every other
//! rank connects and says who it is and what it runs (`hello`: the protocol's version, the
//! run's token, rank, world size, settings). The token is derived from the meeting address and
//! the launcher's run id, which every rank of the run shares: a connection that says nothing
//! within [`HELLO_TIMEOUT`], or says something without the token, is not a rank of this run and
//! is dropped without disturbing the meeting. Rank 0 acknowledges each rank at once (`arrived`,
//! with the token), so a rank that reached another program squatting the port finds out within
//! [`ACK_TIMEOUT`]; it checks that every rank arrived exactly once, within the timeout, with the
//! same settings, and answers each with what the run shares (NCCL's unique id), or with the
//! error that ends the run for all of them.
//!
//! On CPU ranks the same connections carry the sums ([`TcpCollective`]): every rank sends its
//! part to rank 0, which adds them in rank order, `((r0 + r1) + r2) ...` as the file stand-in
//! does, and sends the sum back. Messages are frames: a u32le length, then the bytes.

use super::launcher::{settings_differences, LaunchedRank, RunSettings};
use super::Collective;
use crate::record::RecordError;
use crate::trace::Distributed;
use candle_core::{DType, Tensor};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// How long a rank waits for a sum's parts before it gives up on the others.
const PEER_TIMEOUT: Duration = Duration::from_secs(300);

/// The meeting's protocol: a rank of another version is not a rank of this run.
const PROTOCOL: u32 = 2;

/// How long rank 0 waits for a new connection's hello (a rank sends it as it connects).
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a rank waits for rank 0 to acknowledge its hello.
pub const ACK_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Serialize, Deserialize)]
struct Hello {
    protocol: u32,
    token: String,
    rank: usize,
    world_size: usize,
    settings: RunSettings,
}

#[derive(Serialize, Deserialize)]
enum Answer {
    Arrived { token: String },
    Welcome { shared: Vec<u8> },
    Refused { error: String },
}

/// What every rank of `place`'s run knows and a stranger does not: the protocol, the meeting
/// address and the launcher's run id.
fn token(place: &LaunchedRank) -> String {
    let text = format!("repro-rendezvous\0{PROTOCOL}\0{}\0{}", place.master, place.run_id);
    blake3::hash(text.as_bytes()).to_hex().to_string()
}

/// The ranks of a run, met: rank 0 holds a connection to every other rank, the others one to
/// rank 0.
pub struct Meeting {
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub world_size: usize,
    /// What rank 0 shared with every rank (NCCL's unique id; empty on CPU ranks).
    pub shared: Vec<u8>,
    /// Rank 0: the connections to ranks 1, 2, ...; another rank: its connection to rank 0.
    links: Vec<TcpStream>,
}

fn send(stream: &mut TcpStream, bytes: &[u8]) -> std::io::Result<()> {
    let mut frame = (bytes.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(bytes);
    stream.write_all(&frame)
}

fn receive(stream: &mut TcpStream, limit: usize) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    stream.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > limit {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("a message of {len} bytes")));
    }
    let mut bytes = vec![0; len];
    stream.read_exact(&mut bytes)?;
    Ok(bytes)
}

fn collective_error(message: String) -> RecordError {
    RecordError::Collective(message)
}

/// Meets the other ranks of `place`'s run. Rank 0 makes what the run shares with `shared`
/// (called once, before any rank is answered); `settings` must be every rank's.
pub fn meet(
    place: &LaunchedRank,
    settings: &RunSettings,
    shared: impl FnOnce() -> Result<Vec<u8>, RecordError>,
) -> Result<Meeting, RecordError> {
    match place.rank {
        0 => meet_as_root(place, settings, shared),
        _ => meet_as_peer(place, settings),
    }
}

fn meet_as_root(
    place: &LaunchedRank,
    settings: &RunSettings,
    shared: impl FnOnce() -> Result<Vec<u8>, RecordError>,
) -> Result<Meeting, RecordError> {
    let listener = TcpListener::bind(&place.master).map_err(|e| {
        collective_error(format!(
            "rank 0 cannot listen at {} (MASTER_ADDR:MASTER_PORT): {e}; is another program using the port, or is \
             MASTER_ADDR not an address of rank 0's host?",
            place.master
        ))
    })?;
    let token = token(place);
    listener.set_nonblocking(true).map_err(|e| collective_error(format!("rank 0: {e}")))?;
    let started = Instant::now();
    let mut peers: Vec<Option<TcpStream>> = (1..place.world_size).map(|_| None).collect();
    let refuse_all = |peers: &mut Vec<Option<TcpStream>>, error: &str| {
        let answer = serde_json::to_vec(&Answer::Refused { error: error.to_string() }).unwrap_or_default();
        for stream in peers.iter_mut().flatten() {
            let _ = send(stream, &answer);
        }
    };
    while peers.iter().any(Option::is_none) {
        let (mut stream, _) = match listener.accept() {
            Ok(connection) => connection,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if started.elapsed() > place.timeout {
                    let missing = super::rank_list((1..place.world_size).filter(|r| peers[r - 1].is_none()));
                    let error = format!(
                        "rank(s) {} never arrived at {} within {} s (world size {}): did they start, and can they \
                         reach this address?",
                        missing,
                        place.master,
                        place.timeout.as_secs(),
                        place.world_size
                    );
                    refuse_all(&mut peers, &error);
                    return Err(collective_error(error));
                }
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            Err(e) => return Err(collective_error(format!("rank 0 cannot accept at {}: {e}", place.master))),
        };
        let _ = stream.set_nonblocking(false);
        let _ = stream.set_read_timeout(Some(HELLO_TIMEOUT));
        let hello = receive(&mut stream, 1 << 20).ok().and_then(|bytes| serde_json::from_slice::<Hello>(&bytes).ok());
        // Not a rank of this run (a port scan, another run's rank, a stranger): dropped.
        let Some(hello) = hello.filter(|h| h.protocol == PROTOCOL && h.token == token) else { continue };
        let arrived = serde_json::to_vec(&Answer::Arrived { token: token.clone() }).unwrap_or_default();
        if send(&mut stream, &arrived).is_err() {
            continue;
        }
        let problem = if hello.world_size != place.world_size {
            Some(format!("rank {} counts {} ranks, rank 0 counts {}", hello.rank, hello.world_size, place.world_size))
        } else if hello.rank == 0 || hello.rank >= place.world_size {
            Some(format!("a rank {} arrived, in a run of {} ranks", hello.rank, place.world_size))
        } else if peers[hello.rank - 1].is_some() {
            Some(format!("rank {} arrived twice: two processes were given the same rank", hello.rank))
        } else if hello.settings != *settings {
            let differ = settings_differences(settings, &hello.settings);
            Some(format!("rank {} runs other settings than rank 0 ({differ})", hello.rank))
        } else {
            None
        };
        if let Some(error) = problem {
            let error = format!("{error}; every rank must run the same command");
            let _ =
                send(&mut stream, &serde_json::to_vec(&Answer::Refused { error: error.clone() }).unwrap_or_default());
            refuse_all(&mut peers, &error);
            return Err(collective_error(error));
        }
        peers[hello.rank - 1] = Some(stream);
    }
    let shared = match shared() {
        Ok(shared) => shared,
        Err(e) => {
            refuse_all(&mut peers, &format!("rank 0 failed: {e}"));
            return Err(e);
        }
    };
    let welcome = serde_json::to_vec(&Answer::Welcome { shared: shared.clone() }).unwrap_or_default();
    let mut links = Vec::new();
    for (i, stream) in peers.into_iter().enumerate() {
        let mut stream = stream.expect("every rank arrived");
        send(&mut stream, &welcome)
            .map_err(|e| collective_error(format!("rank 0 cannot answer rank {}: {e}", i + 1)))?;
        links.push(stream);
    }
    Ok(Meeting { rank: 0, world_size: place.world_size, shared, links })
}

fn meet_as_peer(place: &LaunchedRank, settings: &RunSettings) -> Result<Meeting, RecordError> {
    let started = Instant::now();
    let mut stream = loop {
        match TcpStream::connect(&place.master) {
            Ok(stream) => break stream,
            Err(e) if started.elapsed() > place.timeout => {
                return Err(collective_error(format!(
                    "rank {} could not reach rank 0 at {} within {} s: {e}",
                    place.rank,
                    place.master,
                    place.timeout.as_secs()
                )))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    let token = token(place);
    let hello = Hello {
        protocol: PROTOCOL,
        token: token.clone(),
        rank: place.rank,
        world_size: place.world_size,
        settings: settings.clone(),
    };
    send(&mut stream, &serde_json::to_vec(&hello).unwrap_or_default())
        .map_err(|e| collective_error(format!("rank {} cannot reach rank 0 at {}: {e}", place.rank, place.master)))?;
    let answer = |stream: &mut TcpStream, wait: Duration| -> Result<Answer, String> {
        let _ = stream.set_read_timeout(Some(wait));
        let bytes = receive(stream, 1 << 20).map_err(|e| e.to_string())?;
        serde_json::from_slice::<Answer>(&bytes).map_err(|e| format!("not an answer of rank 0's ({e})"))
    };
    // Rank 0 acknowledges at once; anything else at the address is not rank 0 of this run.
    match answer(&mut stream, ACK_TIMEOUT) {
        Ok(Answer::Arrived { token: theirs }) if theirs == token => {}
        Ok(Answer::Refused { error }) => return Err(collective_error(format!("rank 0 ended the run: {error}"))),
        Ok(_) | Err(_) => {
            return Err(collective_error(format!(
                "rank {}: what listens at {} did not answer as rank 0 of this run within {} s: is another program \
                 using the port, or another run's rank 0 (MASTER_PORT)?",
                place.rank,
                place.master,
                ACK_TIMEOUT.as_secs()
            )))
        }
    }
    // Then it answers once every rank has arrived, or when it gives up on them.
    match answer(&mut stream, place.timeout + Duration::from_secs(30)) {
        Ok(Answer::Welcome { shared }) => {
            Ok(Meeting { rank: place.rank, world_size: place.world_size, shared, links: vec![stream] })
        }
        Ok(Answer::Refused { error }) => Err(collective_error(format!("rank 0 ended the run: {error}"))),
        Ok(Answer::Arrived { .. }) => Err(collective_error(format!("rank {}: rank 0 answered twice", place.rank))),
        Err(e) => Err(collective_error(format!("rank {}: rank 0 at {} did not answer: {e}", place.rank, place.master))),
    }
}

/// The CPU stand-in's sums over a [`Meeting`]'s connections.
pub struct TcpCollective {
    meeting: Meeting,
    calls: u64,
}

impl TcpCollective {
    /// Sums over the ranks met in `meeting`.
    pub fn new(meeting: Meeting) -> Self {
        for link in &meeting.links {
            let _ = link.set_read_timeout(Some(PEER_TIMEOUT));
        }
        TcpCollective { meeting, calls: 0 }
    }

    fn lost(&self, rank: usize, e: std::io::Error) -> RecordError {
        collective_error(format!(
            "rank {}: rank {rank} stopped answering during sum #{} ({e}): see rank {rank}'s own error",
            self.meeting.rank, self.calls
        ))
    }
}

impl Collective for TcpCollective {
    fn rank(&self) -> usize {
        self.meeting.rank
    }

    fn world_size(&self) -> usize {
        self.meeting.world_size
    }

    fn all_reduce_sum(&mut self, tensor: &Tensor) -> Result<Tensor, RecordError> {
        if tensor.dtype() != DType::F32 {
            return Err(RecordError::Unsupported(format!(
                "the TCP stand-in sums f32 tensors, not {:?}",
                tensor.dtype()
            )));
        }
        let mine: Vec<f32> = tensor.flatten_all()?.to_vec1()?;
        let bytes: Vec<u8> = mine.iter().flat_map(|v| v.to_le_bytes()).collect();
        let limit = bytes.len();
        let sum_bytes = if self.meeting.rank == 0 {
            let mut sum = mine;
            for r in 1..self.meeting.world_size {
                let part = receive(&mut self.meeting.links[r - 1], limit).map_err(|e| self.lost(r, e))?;
                if part.len() != limit {
                    return Err(collective_error(format!(
                        "rank {r} contributed {} bytes to sum #{}, rank 0 expected {limit}: the ranks are not running \
                         the same model",
                        part.len(),
                        self.calls
                    )));
                }
                for (s, p) in sum.iter_mut().zip(part.chunks_exact(4)) {
                    *s += f32::from_le_bytes([p[0], p[1], p[2], p[3]]);
                }
            }
            let out: Vec<u8> = sum.iter().flat_map(|v| v.to_le_bytes()).collect();
            for r in 1..self.meeting.world_size {
                send(&mut self.meeting.links[r - 1], &out).map_err(|e| self.lost(r, e))?;
            }
            out
        } else {
            send(&mut self.meeting.links[0], &bytes).map_err(|e| self.lost(0, e))?;
            receive(&mut self.meeting.links[0], limit).map_err(|e| self.lost(0, e))?
        };
        self.calls += 1;
        let sum: Vec<f32> = sum_bytes.chunks_exact(4).map(|p| f32::from_le_bytes([p[0], p[1], p[2], p[3]])).collect();
        Ok(Tensor::from_vec(sum, tensor.shape(), tensor.device())?)
    }

    fn describe(&self) -> Distributed {
        Distributed {
            rank: self.meeting.rank as u64,
            world_size: self.meeting.world_size as u64,
            backend: "tcp".into(),
            backend_version: String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(port: u16, rank: usize) -> LaunchedRank {
        LaunchedRank {
            rank,
            world_size: 2,
            local_rank: 0,
            master: format!("127.0.0.1:{port}"),
            rendezvous_dir: None,
            launcher: "torchrun",
            timeout: Duration::from_secs(20),
            run_id: "test".into(),
        }
    }

    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    }

    /// Issue 45, item 13: a silent connection and a forged hello neither stall the meeting for
    /// long nor end it; the real rank is met.
    #[test]
    fn strangers_at_the_meeting_are_dropped_and_the_run_meets() {
        let port = free_port();
        let settings = RunSettings::from([("workload".to_string(), "t".to_string())]);
        let root_settings = settings.clone();
        let root = std::thread::spawn(move || meet(&place(port, 0), &root_settings, || Ok(vec![7])));
        let started = Instant::now();
        let connect = || loop {
            if let Ok(s) = TcpStream::connect(("127.0.0.1", port)) {
                break s;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let _silent = connect();
        let mut forger = connect();
        let forged =
            Hello { protocol: PROTOCOL, token: "guess".into(), rank: 1, world_size: 99, settings: settings.clone() };
        send(&mut forger, &serde_json::to_vec(&forged).unwrap()).unwrap();
        let peer = meet(&place(port, 1), &settings, || Ok(Vec::new())).unwrap();
        assert_eq!(peer.shared, vec![7]);
        assert_eq!(root.join().unwrap().unwrap().links.len(), 1);
        assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    }

    /// A port squatted by another program: the rank that reached it says so within the
    /// acknowledgement's timeout, not the meeting's.
    #[test]
    fn a_squatted_port_is_named_within_the_acknowledgement_timeout() {
        let squatter = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = squatter.local_addr().unwrap().port();
        let held = std::thread::spawn(move || squatter.accept().map(|(s, _)| s));
        let started = Instant::now();
        let settings = RunSettings::new();
        let e = meet(&place(port, 1), &settings, || Ok(Vec::new())).err().expect("not rank 0").to_string();
        assert!(e.contains("did not answer as rank 0 of this run"), "{e}");
        assert!(started.elapsed() < ACK_TIMEOUT + Duration::from_secs(5), "{:?}", started.elapsed());
        drop(held.join());
    }
}
