# kernel methods as a modelling session runs them (kernlab): an RBF support vector classifier
# fitted with 3-fold cross-validation on 3,000 x 20 points for two costs, kernel PCA on 2,000
# points, and a Gaussian process regression on 2,000; every fit copies its data and builds
# kernel matrices (n x n doubles, up to 72 MB), the pattern kernel methods share.
suppressMessages(library(kernlab))
set.seed(4242)
n <- 3000
x <- matrix(rnorm(n * 20), n, 20)
y <- factor(ifelse(rowSums(x[, 1:5]^2) + rnorm(n) > 5, "a", "b"))
for (C in c(1, 8)) {
  m <- ksvm(x, y, kernel = "rbfdot", kpar = list(sigma = 0.05), C = C, cross = 3)
  cat(sprintf("ksvm C=%g: %d SVs, training error %.6f, cross %.6f\n",
              C, nSV(m), error(m), cross(m)))
}
k <- kpca(x[1:2000, ], kernel = "rbfdot", kpar = list(sigma = 0.05), features = 5)
cat(sprintf("kpca eigenvalues: %s\n", paste(sprintf("%.8f", eig(k)), collapse = " ")))
r <- rowSums(x[1:2000, 1:3]) + rnorm(2000, sd = 0.1)
g <- gausspr(x[1:2000, ], r, kernel = "rbfdot", kpar = list(sigma = 0.05), var = 0.01)
p <- predict(g, x[2001:3000, ])
cat(sprintf("gausspr: mean prediction %.8f, sd %.8f\n", mean(p), sd(p)))
