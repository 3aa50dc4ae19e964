module @jit_mixed attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<6xi32>, %arg1: tensor<6xbf16>) -> (tensor<6xi32> {jax.result_info = "result[0]"}, tensor<6xbf16> {jax.result_info = "result[1]"}, tensor<6xi1> {jax.result_info = "result[2]"}) {
    %c = stablehlo.constant dense<3> : tensor<i32>
    %0 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<i32>) -> tensor<6xi32>
    %1 = stablehlo.multiply %arg0, %0 : tensor<6xi32>
    %c_0 = stablehlo.constant dense<1> : tensor<i32>
    %2 = stablehlo.broadcast_in_dim %c_0, dims = [] : (tensor<i32>) -> tensor<6xi32>
    %3 = stablehlo.add %1, %2 : tensor<6xi32>
    %4 = stablehlo.convert %arg1 : (tensor<6xbf16>) -> tensor<6xf32>
    %cst = stablehlo.constant dense<2.000000e+00> : tensor<f32>
    %5 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<6xf32>
    %6 = stablehlo.multiply %4, %5 : tensor<6xf32>
    %7 = stablehlo.convert %6 : (tensor<6xf32>) -> tensor<6xbf16>
    %c_1 = stablehlo.constant dense<2> : tensor<i32>
    %8 = stablehlo.broadcast_in_dim %c_1, dims = [] : (tensor<i32>) -> tensor<6xi32>
    %9 = stablehlo.compare GT, %arg0, %8, SIGNED : (tensor<6xi32>, tensor<6xi32>) -> tensor<6xi1>
    return %3, %7, %9 : tensor<6xi32>, tensor<6xbf16>, tensor<6xi1>
  }
}
