//! The progress of the long commands (record, gate, study): a bar on stderr when it is a
//! terminal, cleared when dropped; plain lines otherwise (CI logs, pre-commit, scripts), at most
//! one every `LINE_EVERY` and one at each new item, so that a run of minutes never stays silent.
//! One style for both: what is counted, the count, the time taken, and a message.

use std::io::IsTerminal;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Off a terminal, the least time between two progress lines (a new item always gets one).
const LINE_EVERY: Duration = Duration::from_secs(10);

/// A progress display counting `what` ("recording step", "recording run", ...).
pub struct Progress {
    bar: indicatif::ProgressBar,
    /// Off a terminal: the state the lines are printed from (shared with the steady ticker).
    lines: Option<Arc<Mutex<Lines>>>,
}

/// What the plain lines say, and when the last one was printed.
struct Lines {
    what: String,
    started: Instant,
    last_line: Option<Instant>,
    /// Lines printed so far.
    printed: u64,
    position: u64,
    length: Option<u64>,
    message: String,
    /// Set when the display is dropped: the steady ticker stops.
    finished: bool,
}

impl Lines {
    /// The line for now: `what pos/len, 12s elapsed: message`.
    fn line(&self) -> String {
        let count = match self.length {
            Some(len) if len > 0 => format!("{}/{len}", self.position),
            _ => self.position.to_string(),
        };
        let message = if self.message.is_empty() { String::new() } else { format!(": {}", self.message) };
        format!("{} {count}, {}s elapsed{message}", self.what, self.started.elapsed().as_secs())
    }

    /// Prints the line if `forced` or `LINE_EVERY` has passed since the last one.
    fn maybe_print(&mut self, forced: bool) {
        let due = self.last_line.is_none_or(|t| t.elapsed() >= LINE_EVERY);
        if forced || due {
            self.last_line = Some(Instant::now());
            self.printed += 1;
            eprintln!("{}", self.line());
        }
    }
}

impl Progress {
    /// A display counting `what`, of `total` if known yet: a bar on a terminal, lines otherwise.
    pub fn new(what: &str, total: Option<u64>) -> Self {
        Self::with_terminal(what, total, std::io::stderr().is_terminal())
    }

    fn with_terminal(what: &str, total: Option<u64>, terminal: bool) -> Self {
        let bar =
            if terminal { indicatif::ProgressBar::new(total.unwrap_or(0)) } else { indicatif::ProgressBar::hidden() };
        let template = format!("{{spinner}} {what} {{pos}}/{{len}} {{wide_bar}} {{elapsed}} {{msg}}");
        bar.set_style(indicatif::ProgressStyle::with_template(&template).expect("valid template"));
        let lines = (!terminal).then(|| {
            Arc::new(Mutex::new(Lines {
                what: what.to_string(),
                started: Instant::now(),
                last_line: None,
                printed: 0,
                position: 0,
                length: total,
                message: String::new(),
                finished: false,
            }))
        });
        Progress { bar, lines }
    }

    /// Keeps the spinner and the clock moving while one item takes seconds or minutes (off a
    /// terminal: a line every `LINE_EVERY` while it does).
    pub fn tick_steadily(self) -> Self {
        self.bar.enable_steady_tick(Duration::from_millis(250));
        if let Some(lines) = &self.lines {
            let lines = Arc::clone(lines);
            std::thread::spawn(move || loop {
                std::thread::sleep(Duration::from_millis(500));
                let mut l = lines.lock().unwrap_or_else(|e| e.into_inner());
                if l.finished {
                    return;
                }
                if l.last_line.is_some() {
                    l.maybe_print(false);
                }
            });
        }
        self
    }

    fn update(&self, change: impl FnOnce(&mut Lines) -> bool) {
        if let Some(lines) = &self.lines {
            let mut l = lines.lock().unwrap_or_else(|e| e.into_inner());
            let forced = change(&mut l);
            l.maybe_print(forced);
        }
    }

    /// Item `index` (from 0) is being worked on: the count shows it from 1, so the first run
    /// reads "1/3" while it records (off a terminal, a line says so at once).
    pub fn working_on(&self, index: u64) {
        self.bar.set_position(index + 1);
        self.update(|l| {
            let new = l.position != index + 1;
            l.position = index + 1;
            new
        });
    }

    /// `done` items of `total` are done.
    pub fn done(&self, done: u64, total: u64) {
        self.bar.set_length(total);
        self.bar.set_position(done);
        self.update(|l| {
            l.length = Some(total);
            l.position = done;
            done == total
        });
    }

    /// The message after the count.
    pub fn message(&self, message: &str) {
        self.bar.set_message(message.to_string());
        if let Some(lines) = &self.lines {
            lines.lock().unwrap_or_else(|e| e.into_inner()).message = message.to_string();
        }
    }

    /// Prints `line` on stderr above the bar.
    pub fn note(&self, line: &str) {
        self.bar.suspend(|| eprintln!("{line}"));
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
        if let Some(lines) = &self.lines {
            lines.lock().unwrap_or_else(|e| e.into_inner()).finished = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_item_worked_on_is_counted_from_one() {
        let p = Progress::with_terminal("recording run", Some(3), true);
        p.working_on(0);
        assert_eq!((p.bar.position(), p.bar.length()), (1, Some(3)), "the first run reads 1/3 while it records");
        p.done(2, 5);
        assert_eq!((p.bar.position(), p.bar.length()), (2, Some(5)));
    }

    #[test]
    fn off_a_terminal_a_line_says_what_runs_and_comes_at_each_new_item_or_after_a_while() {
        let p = Progress::with_terminal("recording run", Some(3), false);
        let lines = p.lines.clone().expect("lines off a terminal");
        let printed = || lines.lock().unwrap().printed;
        p.working_on(0);
        assert_eq!(printed(), 1, "a line at the first item");
        assert!(lines.lock().unwrap().line().starts_with("recording run 1/3, 0s elapsed"));
        p.message("run-0");
        p.working_on(0); // the same item again: no new line before LINE_EVERY
        assert_eq!(printed(), 1);
        p.working_on(1); // a new item: a line at once
        assert_eq!(printed(), 2);
        assert!(lines.lock().unwrap().line().ends_with(": run-0"), "{}", lines.lock().unwrap().line());
        p.done(3, 4); // within LINE_EVERY, not the last: no line
        assert_eq!(printed(), 2);
        p.done(4, 4); // the last: a line
        assert_eq!(printed(), 3);
        assert_eq!(lines.lock().unwrap().line().split(',').next(), Some("recording run 4/4"));
        drop(p);
        assert!(lines.lock().unwrap().finished);
    }
}
