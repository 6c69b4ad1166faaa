//! The facade's error: a message and whether the user or foxc is at fault (exit 1 or 2).

use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// Bad input: a diagnostic, a wrong shape, a missing tensor, no GPU. Exit code 1.
    User,
    /// A bug or an environment failure inside foxc. Exit code 2.
    Internal,
}

#[derive(Clone, Debug)]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
}

impl Error {
    pub fn user(message: impl Into<String>) -> Error {
        Error { kind: ErrorKind::User, message: message.into() }
    }

    pub fn internal(message: impl Into<String>) -> Error {
        Error { kind: ErrorKind::Internal, message: message.into() }
    }

    pub fn exit_code(&self) -> i32 {
        match self.kind {
            ErrorKind::User => 1,
            ErrorKind::Internal => 2,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}
