# R-benchmark-25 "FFT over random values" item, scaled up: forward FFT, spectral low-pass filter and inverse FFT of 2^22-point signals (32 MB real, 64 MB complex each), four signals kept in a list; exercises large complex-vector allocation, copy-on-modify of the spectrum and garbage collection of big temporaries.
set.seed(2502)
n <- 2^22
nsig <- 4
tt <- seq(0, 1, length.out = n)
signals <- lapply(1:nsig, function(k) sin(2 * pi * 50 * k * tt) + 0.5 * cos(2 * pi * 120 * tt) + rnorm(n))

lowpass <- function(x, keep) {
  X <- fft(x)
  m <- length(X)
  X[(keep + 2):(m - keep)] <- 0 # modifies a copy of the spectrum
  Re(fft(X, inverse = TRUE)) / m
}

res <- lapply(signals, lowpass, keep = 4000)
power <- sapply(signals, function(x) { P <- Mod(fft(x))^2; which.max(P[2:(length(P) / 2)]) })
err <- mapply(function(x, y) sqrt(mean((x - y)^2)), signals, res)

# R-benchmark-25 style: repeated transforms of fresh random values
s <- 0
for (i in 1:8) s <- s + Mod(fft(runif(2^21)))[2]
cat(sprintf("peaks %s\n", paste(power, collapse = " ")))
cat(sprintf("residual rms %.6f smooth sum %.6f fft sum %.6f\n", mean(err), sum(sapply(res, sum)), s))
