# R-benchmark-25 "linear regression" item, scaled up: lm() on a 300,000 x 40 data frame (~100 MB) and lm.fit() on its model matrix; exercises model.frame/model.matrix/QR copies of large numeric blocks and R's copy-on-modify when a column is transformed.
set.seed(2501)
n <- 300000; p <- 40
d <- as.data.frame(matrix(rnorm(n * p), n, p))
beta <- seq(-1, 1, length.out = p)
d$y <- drop(as.matrix(d[, 1:p]) %*% beta) + 0.5 * d$V1 * d$V2 + rnorm(n, sd = 2)

fit1 <- lm(y ~ ., data = d)
s1 <- summary(fit1)

# a user transforms columns and refits: each assignment duplicates the data frame's column vector
d2 <- d
d2$V3 <- exp(d2$V3 / 4)
d2$V4 <- d2$V4^2
fit2 <- lm(y ~ . + V1:V2, data = d2)

# lm.fit on the explicit model matrix, for several response variants (as in the benchmark: X \ y)
X <- model.matrix(fit2)
cs <- 0
for (k in 1:4) {
  yk <- d2$y + k * d2$V5
  cs <- cs + sum(lm.fit(X, yk)$coefficients)
}
cat(sprintf("fit1: R2 %.6f sigma %.6f sumcoef %.6f\n", s1$r.squared, s1$sigma, sum(coef(fit1))))
cat(sprintf("fit2: rss %.4f interaction %.6f lm.fit sumcoef %.6f\n",
            sum(residuals(fit2)^2), coef(fit2)[["V1:V2"]], cs))
