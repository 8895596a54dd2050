# regularised discriminant analysis (Friedman 1989, as klaR::rda; klaR is not installed, so it is written here in base R) tuned over a lambda x gamma grid on a 300,000 x 40 matrix (~100 MB) split into training/validation rows, then refit and applied to a test set; exercises row-subset copies per class and per split, cov() centring copies, and mahalanobis()'s centred n x p copies per class and grid point.
set.seed(2514)

## --- RDA in base R -------------------------------------------------------------------------
## Class covariances S_k and the pooled covariance S are blended in two steps (klaR::rda):
##   S_k(lambda)        = (1 - lambda) * S_k + lambda * S                  (lambda=0: QDA, 1: LDA)
##   S_k(lambda, gamma) = (1 - gamma) * S_k(lambda) + gamma * (tr(S_k(lambda)) / p) * I
## (gamma shrinks towards a multiple of the identity). A point x goes to the class with the
## largest discriminant  log(prior_k) - 1/2 log det S_k(lambda, gamma) - 1/2 (x - mu_k)' S_k^-1 (x - mu_k).
rda_fit <- function(x, grouping, lambda, gamma) {
  grouping <- as.factor(grouping)
  lev <- levels(grouping)
  p <- ncol(x)
  nk <- as.vector(table(grouping))
  means <- t(sapply(lev, function(k) colMeans(x[grouping == k, , drop = FALSE])))
  covs <- lapply(lev, function(k) cov(x[grouping == k, , drop = FALSE]))
  pooled <- Reduce(`+`, Map(function(S, m) (m - 1) * S, covs, nk)) / (sum(nk) - length(lev))
  covs <- lapply(covs, function(S) {
    S <- (1 - lambda) * S + lambda * pooled
    (1 - gamma) * S + gamma * (sum(diag(S)) / p) * diag(p)
  })
  list(levels = lev, prior = nk / sum(nk), means = means, covs = covs, lambda = lambda, gamma = gamma)
}

rda_predict <- function(fit, x) {
  scores <- sapply(seq_along(fit$levels), function(k) {
    S <- fit$covs[[k]]
    logdet <- as.numeric(determinant(S, logarithm = TRUE)$modulus)
    log(fit$prior[k]) - 0.5 * logdet - 0.5 * mahalanobis(x, fit$means[k, ], S)
  })
  factor(fit$levels[max.col(scores, ties.method = "first")], levels = fit$levels)
}
## -------------------------------------------------------------------------------------------

p <- 40
mk <- function(n) {
  g <- sample(1:3, n, replace = TRUE, prob = c(0.45, 0.35, 0.2))
  z <- matrix(rnorm(n * p), n, p)
  # classes differ in mean and in covariance (class 2: correlated first columns, class 3: wider)
  z[g == 2, 1:10] <- z[g == 2, 1:10] + 0.8 * z[g == 2, 2:11]
  z[g == 3, ] <- 1.4 * z[g == 3, ]
  z <- z + matrix(c(0, 0.25, -0.2)[g], n, p) * rep(c(1, 1, 0.5, 0.5, rep(0.2, p - 4)), each = n)
  colnames(z) <- paste0("x", 1:p)
  list(x = z, y = factor(c("a", "b", "c")[g]))
}
dat <- mk(300000)
test <- mk(100000)
val <- sample(nrow(dat$x), 100000)
xtr <- dat$x[-val, ]; ytr <- dat$y[-val]
xva <- dat$x[val, ]; yva <- dat$y[val]

grid <- expand.grid(lambda = c(0, 0.5, 1), gamma = c(0, 0.1, 0.3))
grid$err <- sapply(seq_len(nrow(grid)), function(i) {
  f <- rda_fit(xtr, ytr, grid$lambda[i], grid$gamma[i])
  mean(rda_predict(f, xva) != yva)
})
b <- which.min(grid$err)
final <- rda_fit(dat$x, dat$y, grid$lambda[b], grid$gamma[b])
pred <- rda_predict(final, test$x)
cat(sprintf("grid errors %s\n", paste(sprintf("%.6f", grid$err), collapse = " ")))
cat(sprintf("best lambda %.2f gamma %.2f  test error %.6f  predicted a/b/c %s\n", grid$lambda[b], grid$gamma[b],
            mean(pred != test$y), paste(as.vector(table(pred)), collapse = "/")))
