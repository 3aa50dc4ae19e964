module @main {
  func.func public @main(%arg0: tensor<4x10xf32>) -> (tensor<4xf32>, tensor<4xi32>) {
    %v1_init = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %v1 = "stablehlo.reduce"(%arg0, %v1_init) ({
    ^bb0(%v1_a: tensor<f32>, %v1_b: tensor<f32>):
      %v1_c_m = stablehlo.maximum %v1_a, %v1_b : tensor<f32>
      %v1_c_an = stablehlo.compare NE, %v1_a, %v1_a, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %v1_c_bn = stablehlo.compare NE, %v1_b, %v1_b, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %v1_c_t = "stablehlo.select"(%v1_c_bn, %v1_b, %v1_c_m) : (tensor<i1>, tensor<f32>, tensor<f32>) -> tensor<f32>
      %v1_c = "stablehlo.select"(%v1_c_an, %v1_a, %v1_c_t) : (tensor<i1>, tensor<f32>, tensor<f32>) -> tensor<f32>
      stablehlo.return %v1_c : tensor<f32>
    }) {dimensions = array<i64: 1>} : (tensor<4x10xf32>, tensor<f32>) -> tensor<4xf32>
    %v2 = "stablehlo.broadcast_in_dim"(%v1) {broadcast_dimensions = array<i64: 0>} : (tensor<4xf32>) -> tensor<4x10xf32>
    %v3 = stablehlo.subtract %arg0, %v2 : tensor<4x10xf32>
    %v4 = "stablehlo.exponential"(%v3) : (tensor<4x10xf32>) -> tensor<4x10xf32>
    %v5_init = stablehlo.constant dense<0.0> : tensor<f32>
    %v5 = "stablehlo.reduce"(%v4, %v5_init) ({
    ^bb0(%v5_a: tensor<f32>, %v5_b: tensor<f32>):
      %v5_c = stablehlo.add %v5_a, %v5_b : tensor<f32>
      stablehlo.return %v5_c : tensor<f32>
    }) {dimensions = array<i64: 1>} : (tensor<4x10xf32>, tensor<f32>) -> tensor<4xf32>
    %v6_iota = "stablehlo.iota"() {iota_dimension = 1 : i64} : () -> tensor<4x10xi32>
    %v6_initv = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %v6_initi = stablehlo.constant dense<0> : tensor<i32>
    %v6_r:2 = "stablehlo.reduce"(%arg0, %v6_iota, %v6_initv, %v6_initi) ({
    ^bb0(%v6_a: tensor<f32>, %v6_ia: tensor<i32>, %v6_b: tensor<f32>, %v6_ib: tensor<i32>):
      %v6_better = stablehlo.compare GT, %v6_a, %v6_b, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %v6_anan = stablehlo.compare NE, %v6_a, %v6_a, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %v6_bnan = stablehlo.compare NE, %v6_b, %v6_b, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %v6_bnum = stablehlo.not %v6_bnan : tensor<i1>
      %v6_nanwin = stablehlo.and %v6_anan, %v6_bnum : tensor<i1>
      %v6_win = stablehlo.or %v6_better, %v6_nanwin : tensor<i1>
      %v6_eq0 = stablehlo.compare EQ, %v6_a, %v6_b, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %v6_bothnan = stablehlo.and %v6_anan, %v6_bnan : tensor<i1>
      %v6_eq = stablehlo.or %v6_eq0, %v6_bothnan : tensor<i1>
      %v6_first = stablehlo.compare LT, %v6_ia, %v6_ib, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %v6_tie = stablehlo.and %v6_eq, %v6_first : tensor<i1>
      %v6_take = stablehlo.or %v6_win, %v6_tie : tensor<i1>
      %v6_val = "stablehlo.select"(%v6_take, %v6_a, %v6_b) : (tensor<i1>, tensor<f32>, tensor<f32>) -> tensor<f32>
      %v6_idx = "stablehlo.select"(%v6_take, %v6_ia, %v6_ib) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
      stablehlo.return %v6_val, %v6_idx : tensor<f32>, tensor<i32>
    }) {dimensions = array<i64: 1>} : (tensor<4x10xf32>, tensor<4x10xi32>, tensor<f32>, tensor<i32>) -> (tensor<4xf32>, tensor<4xi32>)
    return %v5, %v6_r#1 : tensor<4xf32>, tensor<4xi32>
  }
}
