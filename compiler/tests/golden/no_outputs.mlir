module @main {
  func.func public @main(%arg0: tensor<3xi64>, %arg1: tensor<i1>) {
    return
  }
}
