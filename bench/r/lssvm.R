# least-squares SVM (kernlab::lssvm, RBF kernel, default reduced-rank incomplete Cholesky of rank up to n/3): 5-fold cross-validated fits on 8,000 x 10 points for two kernel widths, then predict() on 40,000 test points; exercises kernlab's large preallocated (mostly untouched) n x rank factor matrices, their per-fold copies and kernel-matrix temporaries (peak ~1 GB).
suppressMessages(library(kernlab))
set.seed(2510)
mk <- function(n) {
  x <- matrix(rnorm(n * 10), n, 10, dimnames = list(NULL, paste0("x", 1:10)))
  y <- factor(ifelse(x[, 1]^2 + x[, 2] - 0.5 * x[, 3] * x[, 4] + 0.5 * rnorm(n) > 1, "pos", "neg"))
  list(x = x, y = y)
}
tr <- mk(8000)
te <- mk(40000)
fits <- lapply(c(0.05, 0.2), function(s)
  lssvm(tr$x, tr$y, kernel = "rbfdot", kpar = list(sigma = s), cross = 5))
cv <- sapply(fits, cross)
best <- fits[[which.min(cv)]]
pred <- predict(best, te$x)
tab <- table(pred, te$y)
cat(sprintf("lssvm: cv error %.6f %.6f  train error %.6f  |coef| sum %.6f\n",
            cv[1], cv[2], error(best), sum(abs(unlist(coef(best))))))
cat(sprintf("test: acc %.6f  predicted pos %d  neg %d\n", sum(diag(tab)) / sum(tab), sum(pred == "pos"), sum(pred == "neg")))
