module @main {
  func.func public @main(%arg0: tensor<4x8xf32>, %arg1: tensor<16x8xf32>, %arg2: tensor<16xf32>, %arg3: tensor<3x16xf32>) -> (tensor<4x3xf32>) {
    %v4 = "stablehlo.dot_general"(%arg0, %arg1) {dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [1]>} : (tensor<4x8xf32>, tensor<16x8xf32>) -> tensor<4x16xf32>
    %v5 = "stablehlo.broadcast_in_dim"(%arg2) {broadcast_dimensions = array<i64: 1>} : (tensor<16xf32>) -> tensor<4x16xf32>
    %v6 = stablehlo.add %v4, %v5 : tensor<4x16xf32>
    %v7 = stablehlo.constant dense<0.0> : tensor<f32>
    %v8 = "stablehlo.broadcast_in_dim"(%v7) {broadcast_dimensions = array<i64>} : (tensor<f32>) -> tensor<4x16xf32>
    %v9_m = stablehlo.maximum %v6, %v8 : tensor<4x16xf32>
    %v9_an = stablehlo.compare NE, %v6, %v6, FLOAT : (tensor<4x16xf32>, tensor<4x16xf32>) -> tensor<4x16xi1>
    %v9_bn = stablehlo.compare NE, %v8, %v8, FLOAT : (tensor<4x16xf32>, tensor<4x16xf32>) -> tensor<4x16xi1>
    %v9_t = "stablehlo.select"(%v9_bn, %v8, %v9_m) : (tensor<4x16xi1>, tensor<4x16xf32>, tensor<4x16xf32>) -> tensor<4x16xf32>
    %v9 = "stablehlo.select"(%v9_an, %v6, %v9_t) : (tensor<4x16xi1>, tensor<4x16xf32>, tensor<4x16xf32>) -> tensor<4x16xf32>
    %v10 = "stablehlo.dot_general"(%v9, %arg3) {dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [1]>} : (tensor<4x16xf32>, tensor<3x16xf32>) -> tensor<4x3xf32>
    %v11 = "stablehlo.tanh"(%v10) : (tensor<4x3xf32>) -> tensor<4x3xf32>
    return %v11 : tensor<4x3xf32>
  }
}
