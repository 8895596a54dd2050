//! Raw memory images: a file that is nothing but pages, back to back (a
//! dump of a memory region, a VM's RAM file, a test image). Its size must be
//! a non-zero multiple of 4096; anything else is refused rather than padded,
//! because a partial page would change every count. The file is
//! memory-mapped; files that cannot be mapped (pipes, some special files)
//! are read into memory instead. The page's "address" is its file offset.

use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::image::{Buffer, Image, InputInfo, Kind, Perms, Region, PAGE};
use crate::read::filter::Filter;

pub fn read(path: &Path, filter: &Filter) -> Result<Image> {
    let start = Instant::now();
    let mut file = File::open(path).map_err(|e| Error::io(path, e))?;
    let meta = file.metadata().map_err(|e| Error::io(path, e))?;
    let buffer = if meta.is_file() {
        let len = meta.len();
        check_size(path, len)?;
        // SAFETY: read-only map of a file the caller named; concurrent
        // truncation by another process would fault, as for any mapped file.
        // Populated up front: one batched fault-in instead of a trap per page
        // during the scan.
        match unsafe { memmap2::MmapOptions::new().populate().map(&file) } {
            Ok(m) => Buffer::Map(m),
            Err(_) => Buffer::Heap(read_all(path, &mut file)?),
        }
    } else {
        let v = read_all(path, &mut file)?;
        check_size(path, v.len() as u64)?;
        Buffer::Heap(v)
    };
    let len = buffer.len() as u64;
    let mut image = Image::new();
    let buf = image.add_buffer(buffer);
    let mut mappings = 0;
    for (a, b) in filter.clip(0, len) {
        let region = Region {
            input: 0,
            addr: a,
            first_page: 0,
            pages: 0,
            kind: Kind::Image,
            perms: Perms {
                read: true,
                ..Perms::default()
            },
            name: None,
        };
        image.push_region(region, buf, a, ((b - a) / PAGE as u64) as usize, None);
        mappings += 1;
    }
    let pages = image.pages();
    image.inputs.push(InputInfo {
        name: path.display().to_string(),
        source: "image",
        pages,
        mappings,
        unpopulated_pages: 0,
        vanished_pages: 0,
        partial_bytes: 0,
        read_seconds: start.elapsed().as_secs_f64(),
        snapshot: None,
    });
    Ok(image)
}

fn check_size(path: &Path, len: u64) -> Result<()> {
    if len == 0 {
        return Err(Error::EmptyFile(path.to_path_buf()));
    }
    if !len.is_multiple_of(PAGE as u64) {
        return Err(Error::NotPageMultiple {
            path: path.to_path_buf(),
            size: len,
        });
    }
    Ok(())
}

fn read_all(path: &Path, file: &mut File) -> Result<Vec<u8>> {
    let mut v = Vec::new();
    file.read_to_end(&mut v).map_err(|e| Error::io(path, e))?;
    Ok(v)
}
