module @main {
  func.func public @main(%arg0: tensor<10x4xf32>, %arg1: tensor<2x3xi32>, %arg2: tensor<2x3x4xf32>) -> (tensor<2x3x4xf32>, tensor<10x4xf32>) {
    %v3 = "stablehlo.gather"(%arg0, %arg1) {dimension_numbers = #stablehlo.gather<offset_dims = [2], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 2>, indices_are_sorted = false, slice_sizes = array<i64: 1, 4>} : (tensor<10x4xf32>, tensor<2x3xi32>) -> tensor<2x3x4xf32>
    %v4 = stablehlo.constant dense<0.0> : tensor<10x4xf32>
    %v5 = "stablehlo.scatter"(%v4, %arg1, %arg2) ({
    ^bb0(%v5_a: tensor<f32>, %v5_b: tensor<f32>):
      %v5_c = stablehlo.add %v5_a, %v5_b : tensor<f32>
      stablehlo.return %v5_c : tensor<f32>
    }) {indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [2], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 2>, unique_indices = false} : (tensor<10x4xf32>, tensor<2x3xi32>, tensor<2x3x4xf32>) -> tensor<10x4xf32>
    return %v3, %v5 : tensor<2x3x4xf32>, tensor<10x4xf32>
  }
}
