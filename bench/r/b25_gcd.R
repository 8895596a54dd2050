# R-benchmark-25 "greatest common divisors (recursion)" item, scaled up: the benchmark's vectorised recursive gcd2() over 5,000,000 pairs (40 MB per vector), three rounds; every recursion level allocates new x, y and x %% y vectors and duplicates y on y[y == 0] <- ..., so many large short-lived copies coexist on the call stack.
set.seed(2504)
gcd2 <- function(x, y) {
  if (sum(y > 1.0E-4) == 0) x else {
    y[y == 0] <- x[y == 0]
    Recall(y, x %% y)
  }
}
n <- 5e6
total <- 0; coprime <- 0; maxg <- 0
for (r in 1:3) {
  a <- ceiling(runif(n) * 1000 * r)
  b <- ceiling(runif(n) * 1000)
  g <- gcd2(a, b)
  total <- total + sum(g)
  coprime <- coprime + sum(g == 1)
  maxg <- max(maxg, g)
}
cat(sprintf("sum gcd %.0f  coprime %.0f  max %.0f  share coprime %.6f\n", total, coprime, maxg, coprime / (3 * n)))
