set.seed(1)
x <- rnorm(5e6)
f <- function(v) { v[1] <- 0; sum(v) }
s <- 0
for (i in 1:20) s <- s + f(x)
m <- matrix(rnorm(1e6), 1000)
fit <- lm.fit(m[, 1:50], m[, 51])
cat(sprintf("%.6f %.6f\n", s, sum(fit$coefficients)))
