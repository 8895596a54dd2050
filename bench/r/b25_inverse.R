# R-benchmark-25 "inverse of a random matrix" item, scaled up: solve() of several 1200x1200 matrices (11 MB each) kept in a list plus a regularised covariance inverse from a 50,000 x 250 data matrix (100 MB); exercises LAPACK work copies (solve duplicates its argument and builds an identity), crossprod temporaries and list-held results.
set.seed(2503)
k <- 1200
mats <- lapply(1:3, function(i) matrix(rnorm(k * k), k, k) + diag(k) * sqrt(k))
invs <- lapply(mats, solve)
chk <- mapply(function(a, ai) max(abs(a[1:200, ] %*% ai[, 1:200] - diag(200))), mats, invs)

# precision matrix of a data set, the way a user computes it
n <- 50000; p <- 250
X <- matrix(rnorm(n * p), n, p)
X[, 2:p] <- X[, 2:p] + 0.3 * X[, 1:(p - 1)]
Xc <- scale(X, center = TRUE, scale = FALSE)
S <- crossprod(Xc) / (n - 1)
P <- solve(S + diag(0.01, p))
cat(sprintf("inverse traces %s\n", paste(sprintf("%.6f", sapply(invs, function(a) sum(diag(a)))), collapse = " ")))
cat(sprintf("max residual %.3e  precision trace %.6f  offdiag %.6f\n", max(chk), sum(diag(P)), sum(P[1, 2:10])))
