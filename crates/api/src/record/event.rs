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
}

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
