//! The progress bar of the long commands (record, gate, study): on stderr when it is a
//! terminal, hidden otherwise, cleared when dropped. One style for all: what is counted, the
//! count, a bar, the time taken, and a message.

use std::time::Duration;

/// A progress bar counting `what` ("recording step", "recording run", ...).
pub struct Progress(indicatif::ProgressBar);

impl Progress {
    /// A bar counting `what`, of `total` if known yet.
    pub fn new(what: &str, total: Option<u64>) -> Self {
        let bar = indicatif::ProgressBar::new(total.unwrap_or(0));
        let template = format!("{{spinner}} {what} {{pos}}/{{len}} {{wide_bar}} {{elapsed}} {{msg}}");
        bar.set_style(indicatif::ProgressStyle::with_template(&template).expect("valid template"));
        Progress(bar)
    }

    /// Keeps the spinner and the clock moving while one item takes seconds or minutes.
    pub fn tick_steadily(self) -> Self {
        self.0.enable_steady_tick(Duration::from_millis(250));
        self
    }

    /// Item `index` (from 0) is being worked on: the bar shows it counted from 1, so the first
    /// run reads "1/3" while it records.
    pub fn working_on(&self, index: u64) {
        self.0.set_position(index + 1);
    }

    /// `done` items of `total` are done.
    pub fn done(&self, done: u64, total: u64) {
        self.0.set_length(total);
        self.0.set_position(done);
    }

    /// The message after the bar.
    pub fn message(&self, message: &str) {
        self.0.set_message(message.to_string());
    }

    /// Prints `line` on stderr above the bar.
    pub fn note(&self, line: &str) {
        self.0.suspend(|| eprintln!("{line}"));
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.0.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_item_worked_on_is_counted_from_one() {
        let p = Progress::new("recording run", Some(3));
        p.working_on(0);
        assert_eq!((p.0.position(), p.0.length()), (1, Some(3)), "the first run reads 1/3 while it records");
        p.done(2, 5);
        assert_eq!((p.0.position(), p.0.length()), (2, Some(5)));
    }
}
