//! A command's failure, as the user reads it: `error: …` on stderr and exit code 2, followed by
//! a `caused by: …` line for each underlying error whose text its message does not already
//! show. Any error converts into it, so a command uses `?` on library results and keeps their
//! sources, rather than flattening each into a string where it fails.

use std::error::Error;
use std::fmt;

/// Why a command failed.
#[derive(Debug)]
pub struct CliError(Box<dyn Error + 'static>);

impl CliError {
    /// The message, then each cause that adds to it, outermost first.
    pub fn lines(&self) -> Vec<String> {
        let mut lines = vec![self.0.to_string()];
        let mut cause = self.0.source();
        while let Some(e) = cause {
            let text = e.to_string();
            // Most library errors already write their source into their message.
            if !lines.last().is_some_and(|last| last.contains(&text)) {
                lines.push(text);
            }
            cause = e.source();
        }
        lines
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.lines().join("\ncaused by: "))
    }
}

impl<E: Into<Box<dyn Error + 'static>>> From<E> for CliError {
    fn from(e: E) -> Self {
        CliError(e.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Outer(std::io::Error, bool);

    impl fmt::Display for Outer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            if self.1 {
                write!(f, "reading the trace failed: {}", self.0)
            } else {
                f.write_str("reading the trace failed")
            }
        }
    }

    impl Error for Outer {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn causes_are_listed_unless_the_message_already_shows_them() {
        let io = || std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let e = CliError::from(Outer(io(), false));
        assert_eq!(e.lines(), ["reading the trace failed", "no such file"]);
        assert_eq!(e.to_string(), "reading the trace failed\ncaused by: no such file");
        let e = CliError::from(Outer(io(), true));
        assert_eq!(e.lines(), ["reading the trace failed: no such file"]);
        assert_eq!(CliError::from("plain").lines(), ["plain"]);
        assert_eq!(CliError::from(format!("made {}", 1)).lines(), ["made 1"]);
    }
}
