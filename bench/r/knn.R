# k-nearest neighbours (class::knn): a 300,000 x 16 labelled data frame (~40 MB) is scaled, split into train/test by row indexing and classified with k = 1, 5, 15 on 600 test rows; exercises scale()/as.matrix()/row-subset copies of a large frame and knn's per-call copies of the training matrix.
suppressMessages(library(class))
set.seed(2507)
n <- 300000; p <- 16
d <- as.data.frame(matrix(rnorm(n * p), n, p))
cl <- with(d, ifelse(V1 + V2 > 0.5, "hi", ifelse(V3 - V4 > 0, "mid", "lo")))
d$label <- factor(cl)
feat <- names(d)[1:p]
d[feat] <- scale(d[feat])
test_idx <- sample(n, 600)
train <- d[-test_idx, ]
test <- d[test_idx, ]
res <- sapply(c(1, 5, 15), function(k) {
  pred <- knn(train[feat], test[feat], train$label, k = k)
  c(mean(pred == test$label), sum(pred == "hi"))
})
cat(sprintf("k=%d acc %.6f  predicted hi %d\n", c(1, 5, 15), res[1, ], as.integer(res[2, ])), sep = "")
