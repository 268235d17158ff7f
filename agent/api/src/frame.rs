//! Framing on the agent's Unix socket:
//!
//! ```text
//! | body length: u32 big-endian | version: u8 | postcard body |
//! ```
//!
//! The length counts the version byte and the body.

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::{API_VERSION, ApiError};

/// Largest frame accepted (room for a few stripes of file data in later versions).
pub const MAX_FRAME: usize = 64 << 20;

/// Most bytes reserved for a frame before they arrive.
const INITIAL_READ_BUFFER: usize = 16 << 20;

/// The oldest protocol version the agent still serves (its answers are encoded for the
/// version each request came in; see [`read_any_frame`]).
pub const OLDEST_API_VERSION: u8 = 3;

pub async fn write_frame<W, T>(w: &mut W, msg: &T) -> Result<(), ApiError>
where
    W: AsyncWrite + Unpin,
    T: TrailingBytes,
{
    write_frame_as(w, API_VERSION, msg).await
}

/// A message that may end with a long byte string (file data). Its frame goes out as a
/// short head and then those bytes straight from the message: a
/// stripe is not copied into a frame buffer first. The bytes on the wire are postcard's
/// all the same, so a reader cannot tell.
pub trait TrailingBytes: Serialize + Sized {
    /// The message with its trailing byte string emptied, and that byte string; `None`
    /// when the message ends with none. The byte string must be the last thing the
    /// message encodes.
    fn split_trailing(&self) -> Option<(Self, &[u8])>;

    /// The message that is nothing but `data` (file data read back), if this type has
    /// one: such a frame is read straight into `data`'s buffer, not decoded out of a
    /// buffer of the whole frame and copied.
    fn only_data(_data: Vec<u8>) -> Option<Self> {
        None
    }

    /// What the encoding of such a message holds before the data's length (see
    /// [`trailing_prefix`]); computed once, not per frame.
    fn only_data_prefix() -> Option<&'static [u8]> {
        None
    }
}

/// The encoding of `empty`, a message whose trailing byte string is empty, without that
/// string's length (a single 0 at its end); `None` when it does not end so.
pub fn trailing_prefix<T: Serialize>(empty: &T) -> Option<Vec<u8>> {
    let mut prefix = postcard::to_allocvec(empty).ok()?;
    (prefix.pop() == Some(0)).then_some(prefix)
}

/// A trailing byte string at least this long is written from where it lies.
const DIRECT_TRAILING: usize = 16 << 10;

/// Writes one frame marked as protocol `version` (the agent answers an older client in
/// the version it spoke).
pub async fn write_frame_as<W, T>(w: &mut W, version: u8, msg: &T) -> Result<(), ApiError>
where
    W: AsyncWrite + Unpin,
    T: TrailingBytes,
{
    if let Some((head, data)) = msg.split_trailing()
        && data.len() >= DIRECT_TRAILING
    {
        let mut frame = encode_frame(version, &head)?;
        // The head ends with the empty byte string's length, a single 0: put the real one.
        if frame.last() == Some(&0) {
            frame.pop();
            put_varint(&mut frame, data.len());
            let len = frame.len() - 4 + data.len();
            if len > MAX_FRAME {
                return Err(ApiError::TooLarge(len));
            }
            frame[..4].copy_from_slice(&(len as u32).to_be_bytes());
            w.write_all(&frame).await?;
            w.write_all(data).await?;
            w.flush().await?;
            return Ok(());
        }
    }
    let frame = encode_frame(version, msg)?;
    w.write_all(&frame).await?;
    w.flush().await?;
    Ok(())
}

/// Writes one frame marked as protocol `version` of the message of type `T` that is file
/// data alone ([`TrailingBytes::only_data`]), whose bytes are `parts` one after another:
/// the frame's head, then each part from where it lies. The bytes on the wire are those
/// of the message holding the parts joined.
pub async fn write_data_frame_as<W, T, P>(
    w: &mut W,
    version: u8,
    parts: &[P],
) -> Result<(), ApiError>
where
    W: AsyncWrite + Unpin,
    T: TrailingBytes,
    P: AsRef<[u8]>,
{
    let data_len: usize = parts.iter().map(|p| p.as_ref().len()).sum();
    let Some(prefix) = T::only_data_prefix() else {
        return Err(ApiError::Decode(
            "this message type has no data-only form".into(),
        ));
    };
    let mut head = Vec::with_capacity(4 + 1 + prefix.len() + 5);
    head.extend_from_slice(&[0; 4]);
    head.push(version);
    head.extend_from_slice(prefix);
    put_varint(&mut head, data_len);
    let len = head.len() - 4 + data_len;
    if len > MAX_FRAME {
        return Err(ApiError::TooLarge(len));
    }
    head[..4].copy_from_slice(&(len as u32).to_be_bytes());
    w.write_all(&head).await?;
    for part in parts {
        w.write_all(part.as_ref()).await?;
    }
    w.flush().await?;
    Ok(())
}

/// The whole frame of `msg`: length, version, body.
fn encode_frame<T: Serialize>(version: u8, msg: &T) -> Result<Vec<u8>, ApiError> {
    // Sized first, then encoded once into the frame: a stripe's data is copied once here,
    // not again for every doubling of a growing buffer and once more into the frame.
    let size = postcard::serialize_with_flavor(msg, postcard::ser_flavors::Size::default())
        .map_err(|e| ApiError::Decode(e.to_string()))?;
    let len = size + 1;
    if len > MAX_FRAME {
        return Err(ApiError::TooLarge(len));
    }
    let mut frame = Vec::with_capacity(len + 4);
    frame.extend_from_slice(&(len as u32).to_be_bytes());
    frame.push(version);
    postcard::to_extend(msg, frame).map_err(|e| ApiError::Decode(e.to_string()))
}

/// Appends `n` as postcard encodes a length (LEB128: 7 bits a byte, low first).
fn put_varint(out: &mut Vec<u8>, mut n: usize) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// A length as postcard encodes it at the start of `bytes`: the value and how many
/// bytes it took; `None` when `bytes` ends first or it overflows.
fn take_varint(bytes: &[u8]) -> Option<(usize, usize)> {
    let mut n: usize = 0;
    for (i, &b) in bytes.iter().enumerate().take(5) {
        n |= usize::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some((n, i + 1));
        }
    }
    None
}

/// Reads one frame of this protocol version; `Ok(None)` on a clean end of stream before a
/// frame starts.
pub async fn read_frame<R, T>(r: &mut R) -> Result<Option<T>, ApiError>
where
    R: AsyncRead + Unpin,
    T: DeserializeOwned + TrailingBytes,
{
    match read_frame_in(r, API_VERSION..=API_VERSION).await? {
        Some((_, msg)) => Ok(Some(msg)),
        None => Ok(None),
    }
}

/// Reads one frame of any version from [`OLDEST_API_VERSION`] to [`API_VERSION`], with its
/// version. Requests only ever gained variants at the end, so every such frame decodes as
/// today's [`crate::Request`].
pub async fn read_any_frame<R, T>(r: &mut R) -> Result<Option<(u8, T)>, ApiError>
where
    R: AsyncRead + Unpin,
    T: DeserializeOwned + TrailingBytes,
{
    read_frame_in(r, OLDEST_API_VERSION..=API_VERSION).await
}

async fn read_frame_in<R, T>(
    r: &mut R,
    versions: std::ops::RangeInclusive<u8>,
) -> Result<Option<(u8, T)>, ApiError>
where
    R: AsyncRead + Unpin,
    T: DeserializeOwned + TrailingBytes,
{
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len == 0 || len > MAX_FRAME {
        return Err(ApiError::TooLarge(len));
    }
    // The head first: a frame of file data alone is read straight into the data's own
    // buffer.
    let mut head = [0u8; HEAD_PEEK];
    let head = &mut head[..len.min(HEAD_PEEK)];
    r.read_exact(head).await?;
    if versions.contains(&head[0])
        && let Some((data_at, data_len)) = only_data_frame::<T>(&head[1..])
        && 1 + data_at + data_len == len
    {
        let mut data = Vec::with_capacity(data_len);
        data.extend_from_slice(&head[1 + data_at..]);
        read_rest(r, &mut data, data_len).await?;
        if let Some(msg) = T::only_data(data) {
            return Ok(Some((head[0], msg)));
        }
    }
    // Room for a few stripes at once (a 4 MiB read is one allocation, not three); past that
    // the buffer grows with the bytes that arrive, not with the length a peer claims.
    let mut buf = Vec::with_capacity(len.min(INITIAL_READ_BUFFER));
    buf.extend_from_slice(head);
    read_rest(r, &mut buf, len).await?;
    decode_body(&buf, versions).map(Some)
}

/// Bytes of a frame read before deciding how to read the rest.
const HEAD_PEEK: usize = 16;

/// Where the data starts and how long it is, when `body` (after the version byte) begins
/// a message that is file data alone.
pub(crate) fn only_data_frame<T: TrailingBytes>(body: &[u8]) -> Option<(usize, usize)> {
    let prefix = T::only_data_prefix()?;
    let (data_len, width) = take_varint(body.strip_prefix(prefix)?)?;
    Some((prefix.len() + width, data_len))
}

/// Reads into `buf` until it holds `want` bytes.
async fn read_rest<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
    want: usize,
) -> Result<(), ApiError> {
    let missing = want.saturating_sub(buf.len());
    let got = r.take(missing as u64).read_to_end(buf).await?;
    if got < missing {
        return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
    }
    Ok(())
}

/// A frame's body (after its length): the version byte, then the message.
pub fn decode_body<T: DeserializeOwned>(
    body: &[u8],
    versions: std::ops::RangeInclusive<u8>,
) -> Result<(u8, T), ApiError> {
    let Some((&version, msg)) = body.split_first() else {
        return Err(ApiError::Decode("empty frame".into()));
    };
    if !versions.contains(&version) {
        return Err(ApiError::Version {
            got: version,
            want: API_VERSION,
        });
    }
    postcard::from_bytes(msg)
        .map(|msg| (version, msg))
        .map_err(|e| ApiError::Decode(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Request, Response};

    #[tokio::test]
    async fn frame_round_trip() {
        let mut buf = Vec::new();
        write_frame(&mut buf, &Request::Status)
            .await
            .expect("write");
        let mut r = &buf[..];
        let got: Option<Request> = read_frame(&mut r).await.expect("read");
        assert_eq!(got, Some(Request::Status));
        let end: Option<Request> = read_frame(&mut r).await.expect("eof");
        assert_eq!(end, None);
    }

    /// The frame as the plain path encodes it: length, version, postcard body.
    fn plain<T: Serialize>(msg: &T) -> Vec<u8> {
        let body = postcard::to_allocvec(msg).expect("encode");
        let mut f = ((body.len() + 1) as u32).to_be_bytes().to_vec();
        f.push(API_VERSION);
        f.extend_from_slice(&body);
        f
    }

    #[tokio::test]
    async fn data_in_parts_goes_out_as_the_message_holding_it_joined() {
        let whole = data(300_007);
        for cuts in [
            vec![],
            vec![0],
            vec![5, 70_000],
            vec![1 << 16, 1 << 17, 300_000],
        ] {
            let mut parts = Vec::new();
            let mut at = 0;
            for c in cuts.iter().copied().chain([whole.len()]) {
                parts.push(whole[at..c].to_vec());
                at = c;
            }
            let mut wire = Vec::new();
            write_data_frame_as::<_, Response, _>(&mut wire, API_VERSION, &parts)
                .await
                .expect("write");
            let read = Response::Fs(crate::FsResponse::Data(whole.clone()));
            assert_eq!(wire, plain(&read), "cut at {cuts:?}");
        }
        let mut wire = Vec::new();
        write_data_frame_as::<_, Response, Vec<u8>>(&mut wire, API_VERSION, &[])
            .await
            .expect("write");
        assert_eq!(wire, plain(&Response::Fs(crate::FsResponse::Data(vec![]))));
        let refused =
            write_data_frame_as::<_, Request, Vec<u8>>(&mut Vec::new(), API_VERSION, &[]).await;
        assert!(refused.is_err(), "a request has no data-only form");
    }

    fn data(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i % 251) as u8).collect()
    }

    #[tokio::test]
    async fn trailing_data_goes_out_byte_for_byte_as_postcard_encodes_it() {
        for n in [0, 1, 15, 16 << 10, (16 << 10) + 1, 200_003, 1 << 20] {
            let write = Request::Fs(crate::FsRequest::Write {
                id: crate::RequestId {
                    client: u64::MAX,
                    seq: 300,
                },
                ino: 1 << 40,
                offset: 127,
                data: data(n),
            });
            let write_then_set = Request::Fs(crate::FsRequest::WriteThenSet {
                id: crate::RequestId {
                    client: 7,
                    seq: u64::MAX,
                },
                ino: 2,
                set: crate::SetAttr {
                    perm: Some(0o644),
                    mtime: Some(crate::SetTime::At(crate::Timestamp {
                        secs: -3,
                        nanos: 999_999_999,
                    })),
                    ..crate::SetAttr::default()
                },
                offset: 0,
                data: data(n),
            });
            let read = Response::Fs(crate::FsResponse::Data(data(n)));
            for write in [&write, &write_then_set] {
                let mut wire = Vec::new();
                write_frame(&mut wire, write).await.expect("write");
                assert_eq!(wire, plain(write), "request with {n} bytes");
                let got: Option<Request> = read_frame(&mut &wire[..]).await.expect("read");
                assert_eq!(got.as_ref(), Some(write));
            }
            let mut wire = Vec::new();
            write_frame(&mut wire, &read).await.expect("write");
            assert_eq!(wire, plain(&read), "response with {n} bytes");
            let got: Option<Response> = read_frame(&mut &wire[..]).await.expect("read");
            assert_eq!(got.as_ref(), Some(&read));
        }
    }

    #[tokio::test]
    async fn frames_around_the_data_fast_path_still_decode() {
        // Shorter than the head the reader peeks at, and other answers that begin alike.
        for msg in [
            Response::Fs(crate::FsResponse::Done),
            Response::Fs(crate::FsResponse::ReadLink("x".repeat(40))),
            Response::Error("no".into()),
        ] {
            let wire = plain(&msg);
            let got: Option<Response> = read_frame(&mut &wire[..]).await.expect("read");
            assert_eq!(got, Some(msg));
        }
        // A data frame cut short is an error, not the clean end of the stream.
        let wire = plain(&Response::Fs(crate::FsResponse::Data(data(100_000))));
        let cut = &wire[..wire.len() - 1];
        assert!(matches!(
            read_frame::<_, Response>(&mut &cut[..]).await,
            Err(ApiError::Io(_))
        ));
        // A data frame whose length disagrees with its body is decoded the usual way
        // (postcard leaves the extra byte unread), and the stream stays in step.
        let mut long = wire.clone();
        long.push(7);
        let len = u32::from_be_bytes([long[0], long[1], long[2], long[3]]) + 1;
        long[..4].copy_from_slice(&len.to_be_bytes());
        long.extend_from_slice(&plain(&Response::Fs(crate::FsResponse::Done)));
        let mut r = &long[..];
        let got: Option<Response> = read_frame(&mut r).await.expect("read");
        assert_eq!(
            got,
            Some(Response::Fs(crate::FsResponse::Data(data(100_000))))
        );
        let got: Option<Response> = read_frame(&mut r).await.expect("read");
        assert_eq!(got, Some(Response::Fs(crate::FsResponse::Done)));
    }

    #[test]
    fn lengths_encode_as_postcard_does() {
        for n in [
            0usize, 1, 127, 128, 16_383, 16_384, 2_097_151, 2_097_152, MAX_FRAME,
        ] {
            let mut mine = Vec::new();
            put_varint(&mut mine, n);
            let theirs = postcard::to_allocvec(&n).expect("encode");
            assert_eq!(mine, theirs, "{n}");
            assert_eq!(take_varint(&mine), Some((n, mine.len())));
        }
        assert_eq!(take_varint(&[0x80, 0x80]), None);
    }

    #[tokio::test]
    async fn oversized_and_foreign_frames_are_errors() {
        let mut r = &[0xff, 0xff, 0xff, 0xff][..];
        assert!(matches!(
            read_frame::<_, Request>(&mut r).await,
            Err(ApiError::TooLarge(_))
        ));
        let newer = API_VERSION + 1;
        let mut r = &[0, 0, 0, 2, newer, 0][..];
        assert!(matches!(
            read_frame::<_, Request>(&mut r).await,
            Err(ApiError::Version { got, .. }) if got == newer
        ));
        let mut r = &[0, 0, 0, 2, API_VERSION, 77][..];
        assert!(matches!(
            read_frame::<_, Request>(&mut r).await,
            Err(ApiError::Decode(_))
        ));
        // The agent takes the previous version too; a client only its own.
        let mut r = &[0, 0, 0, 2, 3, 0][..];
        assert!(matches!(
            read_any_frame::<_, Request>(&mut r).await,
            Ok(Some((3, Request::Status)))
        ));
        let mut r = &[0, 0, 0, 2, 3, 0][..];
        assert!(matches!(
            read_frame::<_, Request>(&mut r).await,
            Err(ApiError::Version { got: 3, .. })
        ));
    }
}
