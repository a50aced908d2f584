//! Event records (daemon → application): their kinds, layout (module docs of `record`) and
//! codec.

use super::{field, get16, get32, get64, put, zero, RecordError, MAX_HANDLE, MAX_SPAN, RECORD_LEN};
use crate::SocketError;

/// What an event record reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// The completion of command `id`: `result` is its value or `-errno`.
    Completion,
    /// Urgent delivery: received bytes were put at `offset..offset+len` of the receive area.
    Data,
    /// The socket became readable (a connection to accept, end of stream).
    Readable,
    /// The socket became writable (handshake done, send space freed).
    Writable,
    /// The connection ended; `result` is `-errno`, or 0 for an orderly close.
    Closed,
    /// One datagram was put at `offset..offset+len` of the receive area (a UDP socket of
    /// the POSIX layer); `result` is its source, `ip << 16 | port` as `GetAddr` answers.
    Datagram,
    /// (Version 8.) This application no longer holds the socket (`Command::Hold`): another
    /// one took it, or this one gave it up. Its next read or wait should take it again.
    Unheld,
    /// (Version 9.) The connection is fused: its pipe's descriptor came on the registration
    /// stream with the 16 bytes [`PIPE_TAG`] + `offset` (the token that names it here).
    /// `len` is the pipe's capacity per direction; `result` holds [`FUSED_WRITES_1`] (this
    /// end writes direction 1, else 0), [`FUSED_SWITCHED`] (this end's bytes already go on
    /// the pipe: an application that adopted the socket) and [`FUSED_OPEN`] (the other end's
    /// pipe bytes may be read).
    Fused,
    /// (Version 9.) Every byte the other end sent before its pipe bytes was delivered ahead
    /// of this event: its pipe may be read from now on.
    PipeOpen,
    /// (Version 9.) The other end wrote into the pipe or freed room in it.
    PipeNews,
}

/// The bytes in front of a pipe's token on the registration stream ([`EventKind::Fused`]).
pub const PIPE_TAG: [u8; 8] = *b"FSPIPE\0\0";
/// [`EventKind::Fused`]: this end writes direction 1 of the pipe (else 0) and reads the
/// other.
pub const FUSED_WRITES_1: i64 = 1;
/// [`EventKind::Fused`]: this end's bytes already go on the pipe.
pub const FUSED_SWITCHED: i64 = 2;
/// [`EventKind::Fused`]: the other end's pipe bytes may be read already.
pub const FUSED_OPEN: i64 = 4;

impl EventKind {
    fn code(self) -> u16 {
        match self {
            EventKind::Completion => 1,
            EventKind::Data => 2,
            EventKind::Readable => 3,
            EventKind::Writable => 4,
            EventKind::Closed => 5,
            EventKind::Datagram => 6,
            EventKind::Unheld => 7,
            EventKind::Fused => 8,
            EventKind::PipeOpen => 9,
            EventKind::PipeNews => 10,
        }
    }
    fn from_code(c: u16) -> Option<Self> {
        Some(match c {
            1 => EventKind::Completion,
            2 => EventKind::Data,
            3 => EventKind::Readable,
            4 => EventKind::Writable,
            5 => EventKind::Closed,
            6 => EventKind::Datagram,
            7 => EventKind::Unheld,
            8 => EventKind::Fused,
            9 => EventKind::PipeOpen,
            10 => EventKind::PipeNews,
            _ => return None,
        })
    }
}

/// A completion or an unsolicited event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventRecord {
    /// What happened.
    pub kind: EventKind,
    /// Request id (completions) or 0.
    pub id: u32,
    /// The socket.
    pub handle: u32,
    /// Value (>= 0) or `-errno`.
    pub result: i64,
    /// Data span start (urgent delivery).
    pub offset: u64,
    /// Data span length.
    pub len: u64,
}

impl EventRecord {
    /// A completion carrying a call's outcome.
    pub fn completion(id: u32, handle: u32, r: Result<u64, SocketError>) -> Self {
        let result = match r {
            Ok(v) => v.min(i64::MAX as u64) as i64,
            Err(e) => -(e.errno() as i64),
        };
        Self {
            kind: EventKind::Completion,
            id,
            handle,
            result,
            offset: 0,
            len: 0,
        }
    }

    /// The outcome of a completion as the caller sees it.
    pub fn outcome(&self) -> Result<u64, SocketError> {
        if self.result < 0 {
            Err(SocketError::from_errno(
                (-self.result).min(i32::MAX as i64) as i32
            ))
        } else {
            Ok(self.result as u64)
        }
    }

    /// Writes the record into `out`.
    pub fn encode(&self, out: &mut [u8; RECORD_LEN]) {
        out.fill(0);
        put(out, field::KIND, &self.kind.code().to_le_bytes());
        put(out, field::ID, &self.id.to_le_bytes());
        put(out, field::HANDLE, &self.handle.to_le_bytes());
        put(out, field::RESULT, &self.result.to_le_bytes());
        put(out, field::OFFSET, &self.offset.to_le_bytes());
        put(out, field::LEN, &self.len.to_le_bytes());
    }

    /// Reads and validates a record from untrusted memory.
    pub fn decode(b: &[u8; RECORD_LEN]) -> Result<Self, RecordError> {
        if !zero(b, field::EV_RESERVED_A)
            || !zero(b, field::EV_RESERVED_B)
            || !zero(b, field::RESERVED_TAIL)
        {
            return Err(RecordError::ReservedNotZero);
        }
        let code = get16(b, field::KIND);
        let kind = EventKind::from_code(code).ok_or(RecordError::UnknownOp(code))?;
        let handle = get32(b, field::HANDLE);
        if handle > MAX_HANDLE {
            return Err(RecordError::BadHandle(handle));
        }
        let offset = get64(b, field::OFFSET);
        let len = get64(b, field::LEN);
        if len > MAX_SPAN || offset.checked_add(len).is_none() {
            return Err(RecordError::BadSpan);
        }
        let mut r = [0; 8];
        r.copy_from_slice(&b[field::RESULT]);
        Ok(Self {
            kind,
            id: get32(b, field::ID),
            handle,
            result: i64::from_le_bytes(r),
            offset,
            len,
        })
    }
}
