module @main {
  func.func public @main(%arg0: tensor<4x2xf32>) -> (tensor<4x2xf32>, tensor<4x4xf32>, tensor<2x2xf32>) {
    %v1 = "stablehlo.all_reduce"(%arg0) ({
    ^bb0(%v1_a: tensor<f32>, %v1_b: tensor<f32>):
      %v1_c = stablehlo.add %v1_a, %v1_b : tensor<f32>
      stablehlo.return %v1_c : tensor<f32>
    }) {replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>} : (tensor<4x2xf32>) -> tensor<4x2xf32>
    %v2 = "stablehlo.all_gather"(%arg0) {all_gather_dim = 1 : i64, replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>} : (tensor<4x2xf32>) -> tensor<4x4xf32>
    %v3 = "stablehlo.reduce_scatter"(%arg0) ({
    ^bb0(%v3_a: tensor<f32>, %v3_b: tensor<f32>):
      %v3_c = stablehlo.maximum %v3_a, %v3_b : tensor<f32>
      stablehlo.return %v3_c : tensor<f32>
    }) {replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>, scatter_dimension = 0 : i64} : (tensor<4x2xf32>) -> tensor<2x2xf32>
    return %v1, %v2, %v3 : tensor<4x2xf32>, tensor<4x4xf32>, tensor<2x2xf32>
  }
}
