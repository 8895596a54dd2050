# naive Bayes (e1071::naiveBayes): fit on a 1,000,000 x 30 data frame (24 numeric + 6 factor columns, ~200 MB) with the formula interface and predict() on a 8,000-row test frame; exercises model-frame copies of a large frame, per-class column subsets (tapply/split copies) and predict's per-row work vectors.
suppressMessages(library(e1071))
set.seed(2511)
mk <- function(n) {
  cls <- sample(c("A", "B", "C"), n, replace = TRUE, prob = c(0.5, 0.3, 0.2))
  shift <- c(A = 0, B = 0.4, C = -0.3)[cls]
  d <- as.data.frame(matrix(rnorm(n * 24), n, 24) + shift)
  for (j in 1:6) d[[paste0("f", j)]] <- factor(ifelse(runif(n) < 0.3 + 0.2 * (cls == "B"), "yes", "no"))
  d$class <- factor(cls)
  d
}
train <- mk(1000000)
test <- mk(8000)
nb <- naiveBayes(class ~ ., data = train)
nb2 <- naiveBayes(class ~ ., data = train, laplace = 1)
pr <- predict(nb, test)
raw <- predict(nb2, test[1:2000, ], type = "raw")
cat(sprintf("apriori %s  mean V1|B %.6f  sd V1|B %.6f\n", paste(nb$apriori, collapse = " "),
            nb$tables$V1["B", 1], nb$tables$V1["B", 2]))
cat(sprintf("test acc %.6f  pred A %d  raw colsum %s\n", mean(pr == test$class), sum(pr == "A"),
            paste(sprintf("%.6f", colSums(raw)), collapse = " ")))
