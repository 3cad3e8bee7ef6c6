//! A chunked response body (RFC 9112 §7.1), read from the connection's buffer as far
//! as it goes, with its trailers.

use bytes::{Buf, Bytes, BytesMut};
use hyper::HeaderMap;

use super::{Error, MAX_HEAD, MAX_HEADERS, fields, spans};

/// A piece of a chunked body.
#[derive(Debug, PartialEq, Eq)]
pub enum Piece {
    Data(Bytes),
    /// The end, with the trailers if there were any.
    End(Option<HeaderMap>),
}

/// Reads a chunked body (RFC 9112 §7.1) from a buffer, as far as it goes.
#[derive(Debug, Default)]
pub struct Chunked {
    /// Bytes of the current chunk's data still to come; `None` between chunks.
    left: Option<u64>,
    /// The CRLF after a chunk's data is still to come.
    crlf: bool,
    /// The last chunk was read: the trailer section is next.
    trailers: bool,
}

impl Chunked {
    /// The next piece from `buf`, `Ok(None)` if `buf` holds too little for one.
    pub fn next(&mut self, buf: &mut BytesMut) -> Result<Option<Piece>, Error> {
        loop {
            if self.trailers {
                return self.trailer_section(buf);
            }
            if self.crlf {
                if buf.len() < 2 {
                    return Ok(None);
                }
                if &buf[..2] != b"\r\n" {
                    return Err(Error::Chunk("no CRLF after a chunk's data"));
                }
                buf.advance(2);
                self.crlf = false;
            }
            if let Some(left) = self.left {
                if buf.is_empty() {
                    return Ok(None);
                }
                let n = left.min(buf.len() as u64) as usize;
                let data = buf.split_to(n).freeze();
                self.left = (left > n as u64).then(|| left - n as u64);
                self.crlf = self.left.is_none();
                return Ok(Some(Piece::Data(data)));
            }
            let Some(line) = line(buf)? else {
                return Ok(None);
            };
            // chunk-size [ ; extensions ]: the extensions mean nothing to snag.
            let size = line[..].split(|b| *b == b';').next().unwrap_or_default();
            let size = size.trim_ascii();
            if size.is_empty() || size.len() > 16 || !size.iter().all(u8::is_ascii_hexdigit) {
                return Err(Error::Chunk("a chunk size is not hexadecimal"));
            }
            let size = u64::from_str_radix(std::str::from_utf8(size).unwrap_or("x"), 16)
                .map_err(|_| Error::Chunk("a chunk size is not hexadecimal"))?;
            if size == 0 {
                self.trailers = true;
            } else {
                self.left = Some(size);
            }
        }
    }

    /// The trailer section after the last chunk, ended by an empty line.
    fn trailer_section(&mut self, buf: &mut BytesMut) -> Result<Option<Piece>, Error> {
        if buf.starts_with(b"\r\n") {
            buf.advance(2);
            return Ok(Some(Piece::End(None)));
        }
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            return if buf.len() > MAX_HEAD {
                Err(Error::Chunk("the trailer section is too long"))
            } else {
                Ok(None)
            };
        };
        let section = buf.split_to(end + 4);
        let malformed = |_| Error::Chunk("a trailer field is malformed");
        let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let spans = match httparse::parse_headers(&section, &mut slots) {
            Ok(httparse::Status::Complete((_, parsed))) => {
                spans(parsed, &section).map_err(malformed)?
            }
            _ => return Err(Error::Chunk("a trailer field is malformed")),
        };
        let trailers = fields(spans, section.freeze()).map_err(malformed)?;
        Ok(Some(Piece::End(Some(trailers))))
    }
}

/// A line ended by CRLF, taken from `buf` without it.
fn line(buf: &mut BytesMut) -> Result<Option<BytesMut>, Error> {
    match buf.windows(2).position(|w| w == b"\r\n") {
        Some(at) => {
            let line = buf.split_to(at);
            buf.advance(2);
            Ok(Some(line))
        }
        None if buf.len() > MAX_HEAD => Err(Error::Chunk("a chunk-size line is too long")),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every piece of `wire` read through [`Chunked`], fed `cut` bytes at a time.
    fn dechunk(wire: &[u8], cut: usize) -> Result<(Vec<u8>, Option<HeaderMap>, usize), Error> {
        let (mut chunked, mut buf, mut body) = (Chunked::default(), BytesMut::new(), Vec::new());
        let mut pieces = wire.chunks(cut);
        loop {
            match chunked.next(&mut buf)? {
                Some(Piece::Data(data)) => body.extend_from_slice(&data),
                Some(Piece::End(trailers)) => return Ok((body, trailers, buf.len())),
                None => match pieces.next() {
                    Some(piece) => buf.extend_from_slice(piece),
                    None => return Err(Error::Chunk("ended early")),
                },
            }
        }
    }

    #[test]
    fn a_chunked_body_is_read_however_the_bytes_are_cut() {
        let wire = b"5;ext=1\r\nhello\r\n1A\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\ngrpc-status: 0\r\nx-b: 2\r\n\r\nNEXT";
        for cut in 1..wire.len() {
            let (body, trailers, rest) = dechunk(wire, cut).unwrap();
            assert_eq!(body, b"helloabcdefghijklmnopqrstuvwxyz", "cut {cut}");
            let trailers = trailers.unwrap();
            assert_eq!(trailers["grpc-status"], "0");
            assert_eq!(trailers["x-b"], "2");
            assert!(rest <= 4, "the next response stays: cut {cut}");
        }
        let (body, trailers, _) = dechunk(b"0\r\n\r\n", 1).unwrap();
        assert!(body.is_empty() && trailers.is_none());
    }

    #[test]
    fn a_malformed_chunked_body_says_why() {
        for (wire, why) in [
            (&b"x\r\nhello\r\n0\r\n\r\n"[..], "not hexadecimal"),
            (b"\r\n", "not hexadecimal"),
            (b"11111111111111111\r\n", "not hexadecimal"),
            (b"2\r\nhiX\r\n0\r\n\r\n", "no CRLF"),
            (b"0\r\nbad trailer\r\n\r\n", "trailer field"),
        ] {
            let err = dechunk(wire, 1).unwrap_err().to_string();
            assert!(err.contains(why), "{wire:?}: {err}");
        }
    }
}
