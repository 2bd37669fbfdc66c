// SPDX-License-Identifier: Apache-2.0
use super::*;
use proptest::prelude::*;

fn f16_bytes(v: f32) -> [u8; 2] {
    half::f16::from_f32(v).to_le_bytes()
}

fn q4_1_block(d: f32, m: f32, q: [u8; 32]) -> Vec<u8> {
    let mut b = Vec::with_capacity(20);
    b.extend(f16_bytes(d));
    b.extend(f16_bytes(m));
    b.extend((0..16).map(|j| q[j] | (q[j + 16] << 4)));
    b
}

#[test]
fn q4_1_block_is_d_times_q_plus_m_low_nibbles_first() {
    let q: [u8; 32] = std::array::from_fn(|j| (j % 16) as u8);
    let m = BlockMatrix::new(Format::Q4_1, 1, 32, q4_1_block(0.5, -2.0, q)).unwrap();
    let w = m.dequantize();
    for (j, w) in w.iter().enumerate() {
        assert_eq!(*w, (j % 16) as f32 * 0.5 - 2.0, "weight {j}");
    }
}

#[test]
fn q8_0_block_is_d_times_signed_q() {
    let mut b = f16_bytes(0.25).to_vec();
    b.extend((0..32).map(|j| (j as i8 - 16) as u8));
    let w = BlockMatrix::new(Format::Q8_0, 1, 32, b).unwrap().dequantize();
    for (j, w) in w.iter().enumerate() {
        assert_eq!(*w, (j as f32 - 16.0) * 0.25, "weight {j}");
    }
}

#[test]
fn sizes_that_do_not_fit_are_refused() {
    assert_eq!(BlockMatrix::new(Format::Q4_1, 2, 48, vec![0; 60]).unwrap_err(), Error::RaggedRow { cols: 48 });
    let e = BlockMatrix::new(Format::Q8_0, 2, 64, vec![0; 135]).unwrap_err();
    assert_eq!(e, Error::Size { format: Format::Q8_0, rows: 2, cols: 64, got: 135, expected: 136 });
    assert!(e.to_string().contains("expected 136"), "{e}");
    let m = BlockMatrix::new(Format::Q4_1, 2, 64, vec![0; 80]).unwrap();
    assert_eq!(m.matmul(&[0.0; 65], 1).unwrap_err(), Error::Input { n: 1, cols: 64, got: 65 });
    assert_eq!(Format::from_name("Q4_1"), Some(Format::Q4_1));
    assert_eq!(Format::from_name("Q4_K"), None);
}

/// A matrix of random blocks with finite scales, and `n` random input rows.
fn case() -> impl Strategy<Value = (BlockMatrix, Vec<f32>, usize)> {
    (prop_oneof![Just(Format::Q4_1), Just(Format::Q8_0)], 0usize..70, 1usize..5, 0usize..10).prop_flat_map(|(format, rows, blocks, n)| {
        let cols = blocks * BLOCK;
        let scale = (-1.0f32..1.0).prop_map(f16_bytes);
        // d, then m (Q4_1 only), then quants; the tail past a block's size is cut off.
        let block = (scale.clone(), scale, prop::collection::vec(any::<u8>(), format.block_bytes())).prop_map(move |(d, m, q)| {
            let mut b = d.to_vec();
            if format == Format::Q4_1 {
                b.extend(m);
            }
            b.extend(&q);
            b.truncate(format.block_bytes());
            b
        });
        (prop::collection::vec(block, rows * blocks), prop::collection::vec(-4.0f32..4.0, n * cols))
            .prop_map(move |(bs, x)| (BlockMatrix::new(format, rows, cols, bs.concat()).unwrap(), x, n))
    })
}

proptest! {
    #[test]
    fn a_product_is_the_product_of_the_dequantized_matrix((m, x, n) in case()) {
        let w = m.dequantize();
        let got = m.matmul(&x, n).unwrap();
        prop_assert_eq!(got.len(), n * m.rows());
        for i in 0..n {
            for r in 0..m.rows() {
                let xi = &x[i * m.cols()..(i + 1) * m.cols()];
                let wr = &w[r * m.cols()..(r + 1) * m.cols()];
                let exact: f64 = xi.iter().zip(wr).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum();
                let magnitude: f64 = xi.iter().zip(wr).map(|(a, b)| (f64::from(*a) * f64::from(*b)).abs()).sum();
                let g = f64::from(got[i * m.rows() + r]);
                prop_assert!((g - exact).abs() <= 1e-5 * magnitude + 1e-30, "row {} out {}: {} vs {}", i, r, g, exact);
            }
        }
    }

    #[test]
    fn a_row_s_result_does_not_depend_on_the_rows_beside_it((m, x, n) in case()) {
        let all = m.matmul(&x, n).unwrap();
        for i in 0..n {
            let one = m.matmul(&x[i * m.cols()..(i + 1) * m.cols()], 1).unwrap();
            prop_assert_eq!(&one[..], &all[i * m.rows()..(i + 1) * m.rows()]);
        }
    }

    #[test]
    fn the_dispatched_kernel_gives_the_baseline_s_bits((m, x, n) in case()) {
        prop_assume!(n >= 1 && m.rows() >= 1);
        let row = &m.data[..m.row_bytes()];
        let xs = [&x[..m.cols()]];
        prop_assert_eq!(dot_block_rows::<1>(m.format(), row, xs), dot_block_rows_baseline::<1>(m.format(), row, xs));
    }
}
