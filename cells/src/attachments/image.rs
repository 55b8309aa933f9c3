//! An image's pixel size from its first bytes (PNG, GIF, JPEG, WebP), so a
//! client can lay a message out before it downloads the file (anything
//! else, or a header cut short, has no size); and a small PNG thumbnail of
//! a PNG or JPEG, decoded under limits that refuse decompression bombs.

/// (width, height) of the image whose file starts with `head`.
pub fn dimensions(head: &[u8]) -> Option<(u32, u32)> {
    let be16 = |i: usize| Some(u16::from_be_bytes(head.get(i..i + 2)?.try_into().ok()?) as u32);
    let le16 = |i: usize| Some(u16::from_le_bytes(head.get(i..i + 2)?.try_into().ok()?) as u32);
    let be32 = |i: usize| Some(u32::from_be_bytes(head.get(i..i + 4)?.try_into().ok()?));
    if head.starts_with(b"\x89PNG\r\n\x1a\n") && head.get(12..16) == Some(b"IHDR") {
        return Some((be32(16)?, be32(20)?));
    }
    if head.starts_with(b"GIF87a") || head.starts_with(b"GIF89a") {
        return Some((le16(6)?, le16(8)?));
    }
    if head.starts_with(b"RIFF") && head.get(8..12) == Some(b"WEBP") {
        let le24 = |i: usize| {
            let b = head.get(i..i + 3)?;
            Some(u32::from(b[0]) | u32::from(b[1]) << 8 | u32::from(b[2]) << 16)
        };
        return match head.get(12..16)? {
            b"VP8X" => Some((le24(24)? + 1, le24(27)? + 1)),
            b"VP8 " => Some((le16(26)? & 0x3fff, le16(28)? & 0x3fff)),
            b"VP8L" => {
                let bits = u32::from_le_bytes(head.get(21..25)?.try_into().ok()?);
                Some(((bits & 0x3fff) + 1, ((bits >> 14) & 0x3fff) + 1))
            }
            _ => None,
        };
    }
    if head.starts_with(&[0xff, 0xd8]) {
        // Walk the segments to the first start-of-frame.
        let mut i = 2;
        while i + 4 <= head.len() {
            if head[i] != 0xff {
                return None;
            }
            let marker = head[i + 1];
            if marker == 0xff {
                i += 1;
                continue;
            }
            let len = be16(i + 2)? as usize;
            let sof = matches!(marker, 0xc0..=0xcf) && !matches!(marker, 0xc4 | 0xc8 | 0xcc);
            if sof {
                return Some((be16(i + 7)?, be16(i + 5)?));
            }
            i += 2 + len;
        }
    }
    None
}

/// A PNG at most `max_px` on its longer side of the PNG or JPEG `bytes`
/// (`None`: not one, damaged, or over the decoding limits).
pub fn thumbnail(bytes: &[u8], max_px: u32) -> Option<Vec<u8>> {
    let mut reader = image::ImageReader::new(std::io::Cursor::new(bytes))
        .with_guessed_format()
        .ok()?;
    let mut limits = image::Limits::default();
    limits.max_image_width = Some(16_384);
    limits.max_image_height = Some(16_384);
    limits.max_alloc = Some(256 * 1024 * 1024);
    reader.limits(limits);
    let decoded = reader.decode().ok()?;
    let small = decoded.thumbnail(max_px, max_px);
    let mut out = std::io::Cursor::new(Vec::new());
    small.write_to(&mut out, image::ImageFormat::Png).ok()?;
    Some(out.into_inner())
}

#[cfg(test)]
mod tests {
    use super::{dimensions, thumbnail};

    #[test]
    fn a_thumbnail_keeps_the_aspect_within_the_bound() {
        let big = image::RgbImage::from_fn(800, 400, |x, y| image::Rgb([x as u8, y as u8, 7]));
        let mut png = std::io::Cursor::new(Vec::new());
        big.write_to(&mut png, image::ImageFormat::Png).unwrap();
        let small = thumbnail(png.get_ref(), 128).unwrap();
        assert_eq!(dimensions(&small), Some((128, 64)));
        assert_eq!(thumbnail(b"not an image at all", 128), None);
    }

    #[test]
    fn sizes_come_from_the_headers() {
        let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
        png.extend_from_slice(&640u32.to_be_bytes());
        png.extend_from_slice(&480u32.to_be_bytes());
        assert_eq!(dimensions(&png), Some((640, 480)));
        let gif = b"GIF89a\x20\x03\x58\x02rest";
        assert_eq!(dimensions(gif), Some((800, 600)));
        // SOI, an APP0 segment of 16 bytes, then SOF0: 8-bit, 1080 x 1920.
        let mut jpeg = vec![0xff, 0xd8, 0xff, 0xe0, 0x00, 0x10];
        jpeg.extend_from_slice(&[0; 14]);
        jpeg.extend_from_slice(&[0xff, 0xc0, 0x00, 0x11, 0x08, 0x07, 0x80, 0x04, 0x38]);
        assert_eq!(dimensions(&jpeg), Some((1080, 1920)));
        assert_eq!(dimensions(b"%PDF-1.7"), None);
        assert_eq!(dimensions(&png[..18]), None);
        assert_eq!(dimensions(&[0xff, 0xd8, 0xff]), None);
    }
}
