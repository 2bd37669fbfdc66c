// SPDX-License-Identifier: Apache-2.0
//! How one attention head's cache maps onto flash pages.

use crate::KvError;

pub use insitu_proto::attention::Dtype;

/// The page geometry of one head: token groups of K and V rows, and dimension groups of K.
///
/// A token-indexed page holds `tokens_per_page` consecutive tokens' rows of K (or of V); a
/// dimension-indexed page holds `dims_per_page` dimensions of K for `tokens_per_dim_page`
/// consecutive tokens, dimension after dimension. With a 4 KiB page, 64-dimension heads and
/// f32, a token page holds 16 tokens and a one-dimension page 1,024 tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Layout {
    /// Dimensions per head.
    pub head_dim: usize,
    /// Stored element type.
    pub dtype: Dtype,
    /// Flash page size in bytes.
    pub page_bytes: usize,
    /// Tokens per token-indexed page.
    pub tokens_per_page: usize,
    /// Dimensions per dimension-indexed page.
    pub dims_per_page: usize,
    /// Tokens per dimension-indexed page.
    pub tokens_per_dim_page: usize,
}

impl Layout {
    /// The layout for heads of `head_dim` elements of `dtype` on pages of `page_bytes`,
    /// with `dims_per_page` dimensions of K in each dimension-indexed page.
    pub fn new(head_dim: usize, dtype: Dtype, page_bytes: usize, dims_per_page: usize) -> Result<Layout, KvError> {
        let row = head_dim * dtype.size();
        if head_dim == 0 || head_dim > 1024 {
            return Err(KvError::BadRequest(format!("head size {head_dim} is not in 1..=1024")));
        }
        if page_bytes < row || !page_bytes.is_multiple_of(row) {
            return Err(KvError::BadRequest(format!("a {page_bytes}-byte page does not hold whole {row}-byte rows")));
        }
        if dims_per_page == 0 || !head_dim.is_multiple_of(dims_per_page) || !page_bytes.is_multiple_of(dims_per_page * dtype.size()) {
            return Err(KvError::BadRequest(format!("{dims_per_page} dimensions per page do not divide a {head_dim}-dimension head")));
        }
        Ok(Layout {
            head_dim,
            dtype,
            page_bytes,
            tokens_per_page: page_bytes / row,
            dims_per_page,
            tokens_per_dim_page: page_bytes / (dims_per_page * dtype.size()),
        })
    }

    /// Token groups (token-indexed pages per kind) for `tokens` tokens, the last one
    /// possibly partial.
    pub fn token_groups(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.tokens_per_page)
    }

    /// Dimension groups of a head.
    pub fn dim_groups(&self) -> usize {
        self.head_dim / self.dims_per_page
    }

    /// Bytes of a row of `head_dim` stored elements.
    pub fn row_bytes(&self) -> usize {
        self.head_dim * self.dtype.size()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_geometry_follows_head_size_type_and_page_size() {
        let l = Layout::new(128, Dtype::F16, 4096, 2).unwrap();
        assert_eq!((l.tokens_per_page, l.tokens_per_dim_page, l.dim_groups()), (16, 1024, 64));
        let l = Layout::new(64, Dtype::F32, 4096, 1).unwrap();
        assert_eq!((l.tokens_per_page, l.tokens_per_dim_page), (16, 1024));
        let l = Layout::new(64, Dtype::F16, 16384, 4).unwrap();
        assert_eq!((l.tokens_per_page, l.tokens_per_dim_page), (128, 2048));
        assert!(Layout::new(96, Dtype::F32, 4096, 1).is_err(), "384-byte rows do not tile a 4 KiB page");
        assert!(Layout::new(64, Dtype::F32, 4096, 3).is_err());
        assert!(Layout::new(0, Dtype::F32, 4096, 1).is_err());
    }
}
